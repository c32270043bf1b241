"""``config_extensions.json``: our policy settings that LeRobot's config class lacks, beside ``config.json``.

LeRobot's parser (draccus, through ``PreTrainedConfig.from_pretrained``) refuses a ``config.json`` with a key
its dataclass does not define, so a single extra key (pi0's ``tokenizer_name`` naming a local tokenizer,
``vision_variant=tiny``) made the whole checkpoint unreadable to LeRobot. Those fields live in a sidecar
instead: LeRobot opens ``config.json`` alone and never sees it, we read both. A config class names such
fields in its spec's ``extension_fields`` (a tuple of field names; ``tests/data/lerobot_config_fields.json``
pins that they are exactly the fields LeRobot's class lacks). A policy LeRobot has no class for (``mlp``,
plugins) declares none and keeps every field in ``config.json``: LeRobot refuses that file by its type,
loudly, since it could not build such a policy anyway.

A directory without the sidecar (LeRobot's own checkpoints, or ours copied without it) loads with the
defaults of those fields, and a ``config.json`` written before the sidecar existed, which carries them
itself, loads as it did. The sidecar never overrides ``config.json``: a field in both with different
values, a LeRobot field in the sidecar, or a sidecar for another policy type is an error naming the files,
because the two files would otherwise mean different policies to LeRobot and to us.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from lerobot_ckpt.layout import POLICY_CONFIG_EXTENSIONS

from lerobot_cli.policies import registry
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.location import own_file

SIDECAR_NAME = POLICY_CONFIG_EXTENSIONS  # spelled by lerobot_ckpt.layout


def extension_fields(cls: type[PolicyConfig]) -> tuple[str, ...]:
    """Fields of ``cls`` that LeRobot's config class of the same type lacks (none unless declared)."""
    return registry.spec_of(cls).extension_fields


def sidecar_path(config_file: Path) -> Path:
    """The sidecar of a policy config file: beside it, whatever the config file is called."""
    return config_file.parent / SIDECAR_NAME


def split(data: Mapping[str, Any], cls: type[PolicyConfig]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(config.json's dict, the sidecar's dict)`` from a full config dict; the sidecar's is empty when
    ``cls`` has no extension fields, and otherwise starts with ``"type"`` so it cannot pair with another
    policy's ``config.json``."""
    ours = extension_fields(cls)
    lerobot = {k: v for k, v in data.items() if k not in ours}
    if not ours:
        return lerobot, {}
    return lerobot, {"type": data["type"], **{k: data[k] for k in ours if k in data}}


def write_sidecar(sidecar: dict[str, Any], path: Path) -> Path | None:
    """Write the sidecar, or remove a stale one when there is nothing to write (a file left by another
    policy in a reused directory would otherwise be merged into this one)."""
    if not sidecar:
        path.unlink(missing_ok=True)
        return None
    path.write_text(json.dumps(sidecar, indent=4) + "\n")
    return path


def merge_sidecar(data: dict[str, Any], config_file: Path) -> tuple[dict[str, Any], list[str]]:
    """``data`` (a parsed ``config.json``) with its sidecar's fields added, and the sidecar's keys the policy
    does not define (a newer version's settings: the caller warns and ignores them, as for ``config.json``).
    ``data`` as is without a sidecar."""
    path = sidecar_path(config_file)
    if not path.is_file() or not isinstance(data.get("type"), str):
        return data, []  # no sidecar; a missing type is reported by the parser, naming config.json
    own_file(path.parent, path.name)  # not a symlink out of the directory
    try:
        sidecar = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(sidecar, dict):
        raise TypeError(f"{path} must hold a JSON object, got {type(sidecar).__name__}")
    if sidecar.get("type") != data["type"]:
        raise ValueError(
            f"{path} is for policy type {sidecar.get('type')!r} but {config_file} is "
            f"{data['type']!r}: the two files belong to different policies"
        )
    cls = registry.config_class(data["type"])
    allowed, known = extension_fields(cls), {a.name for a in attrs.fields(cls)}
    merged, unknown = dict(data), []
    for key, value in sidecar.items():
        if key == "type":
            continue
        if key in allowed:
            if key in data and data[key] != value:
                raise ValueError(
                    f"{key} is {data[key]!r} in {config_file} but {value!r} in {path}; keep it in "
                    f"{path.name} only"
                )
            merged[key] = value
        elif key in known:
            raise ValueError(
                f"{path}: {key} belongs in {config_file.name} (LeRobot's {data['type']} config has it), "
                f"not in {path.name}"
            )
        else:
            unknown.append(key)
    return merged, sorted(unknown)
