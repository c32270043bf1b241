"""Policy configs to and from LeRobot's ``config.json`` shape, with cattrs (torch-free).

A policy config unstructures to a flat dict whose first key is ``"type"`` (the registry name), followed
by every attrs field; features become ``{"type": "STATE", "shape": [..]}`` and enums their values — the
shape LeRobot's draccus writes, so files cross between the two projects. Structuring against the base
``PolicyConfig`` picks the concrete class from ``"type"`` through the registry. Keys the class does not
have (LeRobot grows fields such as ``pretrained_revision``) are dropped with an ``UnknownConfigKeysWarning``
instead of failing, since refusing a LeRobot checkpoint over a flag we do not use helps nobody.

A config class may name ``lerobot_extension_fields``: fields of ours that LeRobot's class lacks. They are
never written into ``config.json`` (LeRobot's parser refuses unknown keys) but into the sidecar
``config_extensions.json`` beside it (``policies.extensions``), so every ``config.json`` we write parses with
LeRobot whatever the settings. ``policy_config_to_dict`` is ``config.json``'s dict,
``policy_config_extensions`` the sidecar's; our own ``train_config.json`` keeps every field of its policy in
one place.

``configure_converter`` installs these hooks on any converter, so the CLI's ``train_config.json``
converter handles ``policy: PolicyConfig | None`` the same way.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn
from lerobot_ckpt.layout import POLICY_CONFIG

from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies import extensions, registry
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.location import own_file

CONFIG_NAME = POLICY_CONFIG  # LeRobot's name, spelled by lerobot_ckpt.layout


class UnknownConfigKeysWarning(UserWarning):
    """A config file carried keys that the config class does not define; they were ignored."""


def _is_policy_config(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, PolicyConfig)


def _unstructure_feature(feature: PolicyFeature) -> dict[str, Any]:
    return {"type": feature.type.value, "shape": list(feature.shape)}


def _structure_feature(data: Any, _: type) -> PolicyFeature:
    if isinstance(data, PolicyFeature):
        return data
    if not isinstance(data, Mapping) or "type" not in data or "shape" not in data:
        raise ValueError(f"a policy feature must look like {{'type': 'STATE', 'shape': [6]}}, got {data!r}")
    return PolicyFeature(type=data["type"], shape=data["shape"])


def _policy_unstructurer(converter: cattrs.Converter) -> Callable[[PolicyConfig], dict[str, Any]]:
    per_class: dict[type, Callable[[Any], dict[str, Any]]] = {}

    def unstructure(config: PolicyConfig) -> dict[str, Any]:
        # Dispatch on the runtime class: a field typed PolicyConfig holds a subclass.
        cls = type(config)
        if cls not in per_class:
            per_class[cls] = make_dict_unstructure_fn(cls, converter)
        return {"type": cls.type, **per_class[cls](config)}

    return unstructure


def _policy_structurer(converter: cattrs.Converter, strict: bool) -> Callable[[Any, type], PolicyConfig]:
    per_class: dict[type, Callable[[Mapping[str, Any], type], Any]] = {}

    def structure(data: Any, cls: type) -> PolicyConfig:
        if isinstance(data, PolicyConfig):
            return data
        if not isinstance(data, Mapping):
            raise TypeError(f"a policy config must be a JSON object, got {type(data).__name__}")
        name = data.get("type")
        if cls is PolicyConfig or not cls.type:
            if not name:
                raise ValueError("a policy config needs a 'type' key naming the policy (e.g. \"act\")")
            cls = registry.config_class(name)
        elif name is not None and name != cls.type:
            raise ValueError(f"config has type {name!r} but {cls.__name__} expects {cls.type!r}")
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(data) - known - {"type"})
        if unknown and strict:
            raise ForbiddenExtraKeysError("", cls, set(unknown))
        if unknown:
            warnings.warn(
                f"{cls.type} policy config: ignoring keys it does not define: {', '.join(unknown)}",
                UnknownConfigKeysWarning,
                stacklevel=3,
            )
        if cls not in per_class:
            per_class[cls] = make_dict_structure_fn(cls, converter)
        return per_class[cls]({k: v for k, v in data.items() if k in known}, cls)

    return structure


def configure_converter(converter: cattrs.Converter, *, strict: bool = False) -> cattrs.Converter:
    """Install the PolicyFeature and polymorphic PolicyConfig hooks on ``converter`` and return it.

    ``strict=True`` makes unknown policy keys an error (our own ``train_config.json``: a typo must not
    become a silent default) instead of the warning used for ``config.json`` files from other versions.
    """
    converter.register_unstructure_hook(PolicyFeature, _unstructure_feature)
    converter.register_structure_hook(PolicyFeature, _structure_feature)
    unstructure = _policy_unstructurer(converter)
    structure = _policy_structurer(converter, strict)
    converter.register_unstructure_hook_factory(_is_policy_config, lambda _cls: unstructure)
    converter.register_structure_hook_factory(_is_policy_config, lambda _cls: structure)
    return converter


# detailed_validation=False: a config's own ValueError (naming the --policy.* flag) reaches the user as is.
converter: cattrs.Converter = configure_converter(cattrs.Converter(detailed_validation=False))


def _full_dict(config: PolicyConfig) -> dict[str, Any]:
    return converter.unstructure(config, unstructure_as=PolicyConfig)


def policy_config_to_dict(config: PolicyConfig) -> dict[str, Any]:
    """``config.json``'s JSON-ready dict: ``"type"`` first, then every field LeRobot's class has (every field,
    for a policy LeRobot lacks); the others are in :func:`policy_config_extensions`."""
    return extensions.split(_full_dict(config), type(config))[0]


def policy_config_extensions(config: PolicyConfig) -> dict[str, Any]:
    """The sidecar's dict: ``"type"``, then the fields LeRobot's class lacks; empty when there are none."""
    return extensions.split(_full_dict(config), type(config))[1]


def policy_config_from_dict(data: Mapping[str, Any], cls: type[PolicyConfig] = PolicyConfig) -> PolicyConfig:
    """Build a validated config; ``cls`` defaults to the base, so ``data["type"]`` decides the class."""
    return converter.structure(data, cls)


def _config_file(path: str | Path) -> Path:
    path = Path(path)
    return path / CONFIG_NAME if path.is_dir() else path


def save_policy_config(config: PolicyConfig, path: str | Path) -> Path:
    """Write ``config.json`` and, for a policy with fields LeRobot lacks, ``config_extensions.json`` beside it
    (``path`` is a directory or the config file itself); returns the config file written."""
    path = Path(path)
    file = path / CONFIG_NAME if path.suffix != ".json" else path
    file.parent.mkdir(parents=True, exist_ok=True)
    lerobot, ours = extensions.split(_full_dict(config), type(config))
    file.write_text(json.dumps(lerobot, indent=4) + "\n")
    extensions.write_sidecar(ours, extensions.sidecar_path(file))
    return file


def load_policy_config(path: str | Path) -> PolicyConfig:
    """Read a policy ``config.json`` (ours or LeRobot's) from a directory or the file itself, with the
    ``config_extensions.json`` beside it when there is one (without it, those fields keep their defaults)."""
    file = _config_file(path)
    if not file.is_file():
        raise FileNotFoundError(f"no policy config at {file}")
    own_file(file.parent, file.name)  # a symlink out of the directory is refused before it is read
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file} is not valid JSON: {exc}") from None
    if isinstance(data, dict):
        data, unknown = extensions.merge_sidecar(data, file)
        if unknown:
            warnings.warn(
                f"{extensions.SIDECAR_NAME}: ignoring keys the {data['type']} policy does not define: "
                f"{', '.join(unknown)}",
                UnknownConfigKeysWarning,
                stacklevel=2,
            )
    return policy_config_from_dict(data)
