"""What an ``adapter_config.json`` may say, checked field by field before peft reads it (torch-free).

An adapter someone sent is untrusted, and peft acts on nearly every key of its config: ``peft_type``
picks the tuner class (a LoHa config loaded LoRA weights silently), ``r=0`` or ``lora_dropout=1.5``
end in a traceback deep in a layer's constructor, a ``target_modules`` regex that matches the empty
name wraps the policy itself, and some keys make peft import a module by name (``megatron_core``) or
run an initialisation over the base weights. So every key this trainer knows is checked against what a
LoRA adapter can hold, and every other key must be unset (null, false or empty), as a newer peft
writes its defaults: one line naming the file, the key, the value and what would be valid.

The checked dict is what the loader hands to peft (``LoraConfig(**fields)``): peft never reads the file
itself, so what was checked is what is used.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lerobot_ckpt.layout import ADAPTER_CONFIG

from lerobot_cli.peft.errors import BASE_KEY, PeftSetupError
from lerobot_cli.policies.location import own_file

_INITS = ("gaussian", "eva", "olora", "pissa", "corda", "loftq", "orthogonal", "mica")
_INERT = (None, False, {}, [], "")


class AdapterConfigError(PeftSetupError):
    """A field of ``adapter_config.json`` a LoRA adapter cannot hold (the message names it)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _regex(value: str) -> str | None:
    try:
        pattern = re.compile(value)
    except re.error as exc:
        return f"is not a valid regular expression ({exc})"
    if pattern.fullmatch("") is not None:
        return "matches every module name, even the empty name of the policy itself (peft fullmatches it)"
    return None


def _targets(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return _regex(value)
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return None
    return "must be one regular expression or a non-empty list of module names"


def _names_or_null(value: Any) -> str | None:
    if value is None or (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
        return None
    return "must be null or a list of module names"


def _pattern_map(check: Callable[[Any], bool], what: str) -> Callable[[Any], str | None]:
    def validate(value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"must be an object of module-name patterns to {what}"
        for key, item in value.items():
            why = _regex(key) if key else "has an empty pattern"
            if why:
                return f"has pattern {key!r}, which {why}"
            if not check(item):
                return f"maps {key!r} to {item!r}, not {what}"
        return None

    return validate


def _init(value: Any) -> str | None:
    if isinstance(value, bool) or value in _INITS or re.fullmatch(r"pissa_niter_\d+", str(value)):
        return None
    return f"must be true, false or one of {', '.join(_INITS)}, pissa_niter_<n>"


def _check(ok: Callable[[Any], bool], why: str) -> Callable[[Any], str | None]:
    return lambda value: None if ok(value) else why


def _rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _names(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value)
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)


# Every key this trainer lets through with a value; each returns None or why the value is refused.
FIELDS: dict[str, Callable[[Any], str | None]] = {
    "peft_type": _check(lambda v: v == "LORA", "is not LORA, the only adapter this trainer loads"),
    BASE_KEY: _check(lambda v: isinstance(v, str) and bool(v), "must name the base policy (path or repo id)"),
    "r": _check(_rank, "must be an integer ≥ 1 (the LoRA rank)"),
    "lora_alpha": _check(lambda v: _is_number(v) and v > 0, "must be a number > 0"),
    "lora_dropout": _check(lambda v: _is_number(v) and 0 <= v < 1, "must be a number in [0, 1)"),
    "target_modules": _targets,
    "modules_to_save": _names_or_null,
    "exclude_modules": lambda v: None if v is None else _targets(v),
    "layers_to_transform": _check(
        lambda v: v is None or _index(v) or (isinstance(v, list) and all(_index(i) for i in v)),
        "must be null, a layer index or a list of layer indices",
    ),
    "layers_pattern": _check(
        lambda v: v is None or bool(_names(v)), "must be null, a module name or a list of them"
    ),
    "rank_pattern": _pattern_map(_rank, "an integer rank ≥ 1"),
    "alpha_pattern": _pattern_map(lambda v: _is_number(v) and v > 0, "a number > 0"),
    "bias": _check(lambda v: v in ("none", "all", "lora_only"), "must be none, all or lora_only"),
    "init_lora_weights": _init,
    "megatron_core": _check(
        lambda v: v in (None, "megatron.core"), "must be megatron.core (peft imports the module it names)"
    ),
    "qalora_group_size": _check(_rank, "must be an integer ≥ 1"),
    "peft_version": _check(lambda v: isinstance(v, str), "must be a version string"),
    "revision": _check(lambda v: v is None or isinstance(v, str), "must be null or a string"),
    **{
        name: _check(lambda v: isinstance(v, bool), "must be true or false")
        for name in (
            "fan_in_fan_out",
            "inference_mode",
            "use_dora",
            "use_rslora",
            "lora_bias",
            "ensure_weight_tying",
        )
    },
}


def _refuse(file: Path, key: str, value: Any, why: str) -> AdapterConfigError:
    shown = json.dumps(value)[:120]
    return AdapterConfigError(
        f"{file}: {key} = {shown} {why} (fix that field, or train a new adapter with "
        "--policy.path=<base> --peft.*)"
    )


def check_adapter_fields(data: Any, file: Path, *, complete: bool = True) -> dict[str, Any]:
    """``data`` (the parsed file) when every field passes; else the one-line refusal of the first bad
    one. Keys peft would act on that are not in :data:`FIELDS` must be unset. ``complete``: the keys a
    load needs (the tuner, the rank, the targets) must be there too; the run's plan, which only needs the
    base, checks the values first and leaves their absence to the load."""
    if not isinstance(data, dict):
        raise AdapterConfigError(f"{file} must hold a JSON object (peft's adapter config)")
    for key in ("peft_type", "r", "target_modules") if complete else ():
        if key not in data:
            raise AdapterConfigError(f"{file} has no {key!r}: not a LoRA adapter config written by peft")
    for key, value in data.items():
        check = FIELDS.get(key)
        if check is None:
            if not any(value == inert and type(value) is type(inert) for inert in _INERT):
                raise _refuse(file, key, value, "is set, and this trainer does not load adapters that set it")
            continue
        why = check(value)
        if why:
            raise _refuse(file, key, value, why)
    return data


def read_adapter_config(directory: str | Path, *, complete: bool = True) -> dict[str, Any]:
    """The checked fields of ``directory/adapter_config.json`` (the directory's own file, not a symlink
    out of it); one line for a file that cannot be read or a field that cannot be loaded."""
    file = own_file(directory, ADAPTER_CONFIG)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AdapterConfigError(f"{file} is not a readable PEFT adapter config ({exc})") from None
    return check_adapter_fields(data, file, complete=complete)
