"""What flags exist and how their text becomes JSON-ready values, read off the attrs classes.

The config classes are the only source of truth: a field added there is a flag here, with its
type, default and the ``help``/``choices`` metadata, without a second list to keep in sync.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from typing import Any

import attrs
from attrs import define

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.configio import resolve_all_types

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_NULL = ("null", "none")
# What a boolean flag accepts, as the error and the README list it (case-insensitive).
BOOLEAN_SPELLINGS = "true/false, 1/0, yes/no or on/off"


@define(frozen=True)
class FlagSpec:
    path: str
    type: Any
    default: Any
    help: str
    choices: tuple[str, ...] | None


def unwrap_optional(t: Any) -> tuple[Any, bool]:
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        optional = len(args) != len(typing.get_args(t))
        return (args[0] if len(args) == 1 else t), optional
    return t, False


def section_class(t: Any) -> type | None:
    """The attrs class a field holds (optional sections included), else None."""
    inner, _ = unwrap_optional(t)
    return inner if isinstance(inner, type) and attrs.has(inner) else None


def _default_of(a: attrs.Attribute) -> Any:
    if isinstance(a.default, attrs.Factory):  # type: ignore[arg-type]
        return a.default.factory()
    return a.default


def _choices(a: attrs.Attribute, inner: Any) -> tuple[str, ...] | None:
    if "choices" in a.metadata:
        return tuple(a.metadata["choices"])
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return tuple(str(m.value) for m in inner)
    return None


def field_specs(cls: type, prefix: str = "", recurse: bool = True) -> list[FlagSpec]:
    """Every leaf flag below ``cls`` (sections are walked, optional ones too)."""
    out: list[FlagSpec] = []
    for a in attrs.fields(resolve_all_types(cls)):
        path = f"{prefix}{a.name}"
        sub = section_class(a.type)
        if sub is not None and recurse and not _is_polymorphic(sub):
            out += field_specs(sub, f"{path}.")
            continue
        inner, _ = unwrap_optional(a.type)
        out.append(FlagSpec(path, a.type, _default_of(a), a.metadata.get("help", ""), _choices(a, inner)))
    return out


def _is_polymorphic(cls: type) -> bool:
    from lerobot_cli.envs.config import EnvConfig
    from lerobot_cli.policies.config import PolicyConfig

    return issubclass(cls, PolicyConfig | EnvConfig)


def type_name(t: Any) -> str:
    inner, optional = unwrap_optional(t)
    origin = typing.get_origin(inner)
    if inner is bool:
        name = "bool"
    elif inner in (int, float, str):
        name = inner.__name__
    elif isinstance(inner, type) and issubclass(inner, enum.Enum):
        name = "str"
    elif origin in (list, tuple):
        args = [a for a in typing.get_args(inner) if a is not Ellipsis]
        name = f"json list[{type_name(args[0]) if args else 'any'}]"
    elif origin is dict or (isinstance(inner, type) and attrs.has(inner)):
        name = "json object"
    else:
        name = str(inner).replace("typing.", "")
    return f"{name}|null" if optional else name


def _example(inner: Any) -> str:
    origin = typing.get_origin(inner)
    if origin in (list, tuple):
        args = [a for a in typing.get_args(inner) if a is not Ellipsis]
        return (
            "'[0, 3, 5]'"
            if args and args[0] is int
            else '\'["A", "B"]\''
            if args and args[0] is str
            else "'[0.9, 0.999]'"
        )
    return '\'{"key": "value"}\''


def convert(spec: FlagSpec, raw: str) -> Any:
    """Text of ``--path=raw`` → a JSON-ready value, or a UsageError naming the flag and expected type."""
    flag = f"--{spec.path}"
    inner, optional = unwrap_optional(spec.type)
    text = raw.strip()
    if spec.choices is not None and text in spec.choices:
        # A choice spelled like null (activation checkpointing's `none`, its default) is that choice.
        return text
    if text.lower() in _NULL:
        if optional:
            return None
        choose = f"; choose from {', '.join(spec.choices)}" if spec.choices else ""
        raise UsageError(f"{flag} cannot be null (expected {type_name(spec.type)}{choose})")
    if inner is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise UsageError(f"{flag}: expected a boolean ({BOOLEAN_SPELLINGS}), got {raw!r}")
    if inner is int:
        try:
            return int(text)
        except ValueError:
            raise UsageError(f"{flag}: expected an integer, got {raw!r}") from None
    if inner is float:
        try:
            return float(text)
        except ValueError:
            raise UsageError(f"{flag}: expected a number, got {raw!r}") from None
    if inner is str or (isinstance(inner, type) and issubclass(inner, enum.Enum)):
        if spec.choices is not None and raw not in spec.choices:
            raise UsageError(f"{flag}: invalid choice {raw!r} (choose from {', '.join(spec.choices)})")
        return raw
    origin = typing.get_origin(inner)
    want = list if origin in (list, tuple) else dict
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, want):
        kind = "a JSON list" if want is list else "a JSON object"
        raise UsageError(f"{flag}: expected {kind}, e.g. {flag}={_example(inner)}, got {raw!r}")
    return value
