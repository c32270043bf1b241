"""cattrs at the JSON edge: ``train_config.json`` and policy ``config.json`` (torch-free).

One converter knows every section; policies are polymorphic by their ``type`` key (the hooks of
``policies.serialization``). Train configs are strict: unknown keys are errors, since a typo must not
silently become a default. Policy ``config.json`` files from other LeRobot versions are read leniently
by ``policies.serialization.load_policy_config``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn
from lerobot_ckpt.layout import TRAIN_CONFIG

from lerobot_cli.config import TrainConfig
from lerobot_cli.envs.config import EnvConfig, env_class
from lerobot_cli.policies import registry
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.serialization import configure_converter


class ConfigFileError(ValueError):
    """A config file (or dict) that cannot become a config; the message names the file and key."""


def resolve_all_types(cls: type) -> type:
    """Turn string annotations (``from __future__ import annotations``) into types, recursively."""
    if getattr(cls, "__lerobot_types_resolved__", None) is cls:
        return cls
    attrs.resolve_types(cls)
    cls.__lerobot_types_resolved__ = cls
    for a in attrs.fields(cls):
        for t in (a.type, *getattr(a.type, "__args__", ())):
            for inner in (t, *getattr(t, "__args__", ())):
                if isinstance(inner, type) and attrs.has(inner):
                    resolve_all_types(inner)
    return cls


def _strict_bool(value: Any, _type: type) -> bool:
    """JSON ``true``/``false`` only: cattrs' default ``bool(value)`` would read ``"false"`` or ``"maybe"``
    in a hand-edited ``train_config.json`` as true (``--checkpoint_async``, ``--save_checkpoint`` …)."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"JSON true or false, not {value!r}")


def _is_env_config(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, EnvConfig)


def _env_hooks(converter: cattrs.Converter) -> None:
    """``env`` is polymorphic by its ``type`` key (``--env.type``), as the policy is: ``{"type": "pusht",
    <PushtEnvConfig's fields>}``; unknown keys are errors (``forbid_extra_keys``)."""
    unstructurers: dict[type, Any] = {}
    structurers: dict[type, Any] = {}

    def unstructure(config: EnvConfig) -> dict[str, Any]:
        cls = type(config)
        if cls not in unstructurers:
            unstructurers[cls] = make_dict_unstructure_fn(cls, converter)
        return {"type": cls.type, **unstructurers[cls](config)}

    def structure(data: Any, _cls: type) -> EnvConfig:
        if isinstance(data, EnvConfig):
            return data
        if not isinstance(data, dict):
            raise TypeError(f"an env config must be a JSON object, got {type(data).__name__}")
        cls = env_class(data.get("type"))
        if cls not in structurers:
            resolve_all_types(cls)
            structurers[cls] = make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True)
        return structurers[cls]({k: v for k, v in data.items() if k != "type"}, cls)

    converter.register_unstructure_hook_factory(_is_env_config, lambda _cls: unstructure)
    converter.register_structure_hook_factory(_is_env_config, lambda _cls: structure)


converter = configure_converter(cattrs.Converter(forbid_extra_keys=True), strict=True)
converter.register_structure_hook(bool, _strict_bool)
_env_hooks(converter)
resolve_all_types(TrainConfig)


def _names_itself(message: str, path: str) -> bool:
    """A message that starts with a flag (``--steps …``) or with its own config path (the library
    configs' ``parallelism.dp_shard must be …``, respelled as flags when printed) needs no prefix."""
    where = path.lstrip(".")
    return message.startswith("--") or bool(where) and message.startswith(where)


def _flatten_errors(exc: BaseException, path: str) -> list[str]:
    if isinstance(exc, ClassValidationError | cattrs.errors.IterableValidationError):
        out: list[str] = []
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            name = getattr(note, "name", None)
            index = getattr(note, "index", None)
            sub_path = (
                f"{path}.{name}" if name is not None else f"{path}[{index!r}]" if index is not None else path
            )
            expected = getattr(note, "type", None)
            named = _names_itself(str(sub), sub_path)
            if isinstance(sub, TypeError | ValueError) and not named and expected is not None:
                shown = getattr(expected, "__name__", None) or str(expected).replace("typing.", "")
                out.append(f"{sub_path.lstrip('.')}: expected {shown} ({sub})")
                continue
            out += _flatten_errors(sub, sub_path)
        for sub in without:
            out += _flatten_errors(sub, path)
        return out
    if isinstance(exc, ForbiddenExtraKeysError):
        keys = ", ".join(f"{path}.{k}".lstrip(".") for k in sorted(exc.extra_fields))
        return [f"unknown key(s) {keys}"]
    if isinstance(exc, KeyError):
        return [f"missing required key {path.lstrip('.')}.{exc.args[0]}"]
    msg = str(exc)
    if isinstance(exc, TypeError | ValueError) and not _names_itself(msg, path):
        where = path.lstrip(".")
        return [f"{where}: {msg}" if where else msg]
    return [msg]


def structure_train_config(data: dict[str, Any], source: str) -> TrainConfig:
    """Build a TrainConfig from JSON data; every failure becomes one ConfigFileError naming ``source``."""
    try:
        return converter.structure(data, TrainConfig)
    except registry.UnknownPolicyError:
        raise
    except (ClassValidationError, ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, ConfigFileError):
            raise
        problems = "; ".join(_flatten_errors(exc, ""))
        raise ConfigFileError(f"{source}: {problems}" if source else problems) from None


def unstructure_train_config(cfg: TrainConfig) -> dict[str, Any]:
    return converter.unstructure(cfg)


def save_train_config(cfg: TrainConfig, directory: Path) -> Path:
    path = Path(directory) / TRAIN_CONFIG
    path.write_text(json.dumps(unstructure_train_config(cfg), indent=4) + "\n")
    return path


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigFileError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise ConfigFileError(f"{what} {path} cannot be read ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigFileError(
            f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{what} {path} must hold a JSON object, not {type(data).__name__}")
    return data


def load_train_config(path: Path) -> TrainConfig:
    return structure_train_config(read_json(path, "--config_path"), f"--config_path {path}")


def unstructure_policy_config(cfg: PolicyConfig) -> dict[str, Any]:
    return converter.unstructure(cfg, unstructure_as=PolicyConfig)
