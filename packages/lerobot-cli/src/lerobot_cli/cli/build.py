"""Flags (+ an optional ``--config_path`` file) → one validated ``TrainConfig``.

Order matters and is the one a user expects: the file (or defaults) is the base, the policy is
chosen by ``--policy.type``/``--policy.path``, ``--policy.*`` fields override it, the policy's
optimizer/scheduler presets fill what the file did not say, and the remaining flags override last.
"""

from __future__ import annotations

import difflib
import logging
import warnings
from pathlib import Path
from typing import Any

import attrs
import cattrs
from lerobot_ckpt.layout import POLICY_CONFIG

from lerobot_cli import configio
from lerobot_cli.cli.errors import UsageError
from lerobot_cli.cli.lerobot_only import lerobot_only
from lerobot_cli.cli.paths import resolve_config_path, resolve_policy_dir
from lerobot_cli.cli.schema import FlagSpec, convert, field_specs
from lerobot_cli.config import TrainConfig
from lerobot_cli.envs.config import ENV_TYPES, EnvConfig, env_class
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.peft.config import PeftConfig
from lerobot_cli.policies import registry
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.serialization import UnknownConfigKeysWarning, load_policy_config
from lerobot_cli.sample_weighting.config import SampleWeightingConfig

log = logging.getLogger(__name__)

SPECIAL_FLAGS = ("config_path", "policy.type", "policy.path", "env.type")
_OPTIONAL_SECTIONS: dict[str, type] = {
    "optimizer": OptimizerConfig,
    "scheduler": SchedulerConfig,
    "peft": PeftConfig,
    "sample_weighting": SampleWeightingConfig,
}


@attrs.define(frozen=True)
class BuildResult:
    config: TrainConfig
    config_path: Path | None
    warnings: tuple[str, ...] = ()


def known_flags(
    policy_cls: type[PolicyConfig] | None, env_cls: type[EnvConfig] | None = None
) -> dict[str, FlagSpec]:
    specs = {s.path: s for s in field_specs(TrainConfig)}
    # Optional sections can also be set whole (--peft=null, --scheduler='{...}').
    for a in attrs.fields(TrainConfig):
        if a.name in _OPTIONAL_SECTIONS:
            specs.setdefault(a.name, FlagSpec(a.name, a.type, None, a.metadata.get("help", ""), None))
    specs.pop("policy", None)
    specs.pop("env", None)
    if policy_cls is not None:
        specs.update({s.path: s for s in field_specs(policy_cls, "policy.")})
    if env_cls is not None:
        specs.update({s.path: s for s in field_specs(env_cls, "env.")})
    return specs


def _unknown_flag(
    name: str,
    specs: dict[str, FlagSpec],
    policy_cls: type[PolicyConfig] | None,
    env_cls: type[EnvConfig] | None = None,
) -> UsageError:
    if name.startswith("policy.") and policy_cls is None:
        return UsageError(
            f"--{name} needs a policy: pass --policy.type=NAME ({', '.join(registry.available())}) "
            f"or --policy.path=DIR before its fields can be set"
        )
    if name.startswith("env.") and env_cls is None:
        return UsageError(
            f"--{name} needs an env: pass --env.type=NAME ({', '.join(ENV_TYPES)}) "
            "before its fields can be set"
        )
    candidates = list(specs) + list(SPECIAL_FLAGS)
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    hint = f"; did you mean --{close[0]}?" if close else "; see --help for the list"
    return UsageError(f"unknown flag --{name}{hint}")


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        if node.get(part) is None:
            section = ".".join(parts[: i + 1])
            default_cls = _OPTIONAL_SECTIONS.get(section)
            node[part] = configio.converter.unstructure(default_cls()) if default_cls else {}
        node = node[part]
    node[parts[-1]] = value


def _load_policy(path_flag: str, messages: list[str]) -> dict[str, Any]:
    directory = resolve_policy_dir(path_flag)
    file = directory / POLICY_CONFIG
    configio.read_json(file, "--policy.path config")  # missing / not JSON → one sentence naming the file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnknownConfigKeysWarning)
        try:
            policy = load_policy_config(file)
        except (ValueError, TypeError, cattrs.BaseValidationError) as exc:
            raise UsageError(f"--policy.path {file}: {exc}") from None
    messages += [
        f"--policy.path {file}: {w.message}"
        for w in caught
        if issubclass(w.category, UnknownConfigKeysWarning)
    ]
    data = configio.unstructure_policy_config(policy)
    # Symlinks resolved (`checkpoints/last` → the step directory): the config names the weights it really
    # loaded, which a later save of that run cannot move on.
    data["pretrained_path"] = str(directory.resolve())
    return data


def _structure(tree: dict[str, Any], source: str) -> TrainConfig:
    try:
        return configio.structure_train_config(tree, source)
    except (configio.ConfigFileError, registry.UnknownPolicyError) as exc:
        raise UsageError(str(exc)) from None


def _choose_env(tree: dict[str, Any], flags: dict[str, str]) -> type[EnvConfig] | None:
    """``--env.type`` (popped from ``flags``) chooses the env section's class, as ``--policy.type`` does the
    policy's; ``--env=null`` removes an env the config file had. Returns the class whose ``--env.*`` fields
    the flags may set (None: no env)."""
    if "env" in flags:
        raw = flags.pop("env")
        if raw.strip().lower() not in ("null", "none", ""):
            raise UsageError(
                f"--env={raw}: an env's own config file is not read here: pass --env.type=NAME and its "
                "fields as flags (--env.task=...), or the whole run's config with --config_path"
            )
        tree["env"] = None
    etype = flags.pop("env.type", None)
    if etype is not None and etype.strip().lower() in ("null", "none", ""):
        tree["env"], etype = None, None  # LeRobot's spelling of no env
    try:
        if etype is not None:
            env_class(etype)
            if not (tree.get("env") and tree["env"].get("type") == etype):
                tree["env"] = {"type": etype}
        return env_class(tree["env"]["type"]) if tree.get("env") else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def build_train_config(flags: dict[str, str]) -> BuildResult:
    flags = dict(flags)
    messages: list[str] = []
    config_path = None
    if "config_path" in flags:
        config_path = resolve_config_path(flags.pop("config_path"))
        tree = configio.read_json(config_path, "--config_path") if config_path else {}
        _structure(tree, f"--config_path {config_path}")  # file problems named as such, before flags mix in
    else:
        tree = configio.unstructure_train_config(TrainConfig())
    # The file alone was valid, so whatever fails from here on comes from the flags mixed into it: those
    # messages name the flag (a flag's bad value must not be blamed on the file).
    source = ""
    from_file = config_path is not None

    ptype, ppath = flags.pop("policy.type", None), flags.pop("policy.path", None)
    if ptype is not None and ppath is not None:
        raise UsageError(
            "--policy.type and --policy.path both given: use --policy.path alone to start "
            "from a pretrained policy, or --policy.type alone to start from scratch"
        )
    try:
        if ppath is not None:
            tree["policy"] = _load_policy(ppath, messages)
        elif ptype is not None:
            registry.config_class(ptype)
            if not (tree.get("policy") and tree["policy"].get("type") == ptype):
                tree["policy"] = {"type": ptype}
        policy_cls = registry.config_class(tree["policy"]["type"]) if tree.get("policy") else None
    except registry.UnknownPolicyError as exc:
        raise UsageError(str(exc)) from None

    env_cls = _choose_env(tree, flags)
    specs = known_flags(policy_cls, env_cls)
    values: dict[str, Any] = {}
    for name, raw in flags.items():
        spec = specs.get(name)
        if spec is None:
            if lerobot_only(name, raw):
                continue  # a LeRobot flag whose value keeps its feature off: nothing to set
            raise _unknown_flag(name, specs, policy_cls, env_cls)
        values[name] = convert(spec, raw)
    presets = values.get("use_policy_training_preset", tree.get("use_policy_training_preset", True))

    for name, value in values.items():
        if name.startswith("policy."):
            _set(tree, name, value)
    if not from_file and tree.get("policy") is not None and presets:
        policy = _structure(tree, source).policy
        if tree.get("optimizer") is None:
            tree["optimizer"] = configio.converter.unstructure(policy.optimizer_preset())
        if tree.get("scheduler") is None and (preset := policy.scheduler_preset()) is not None:
            tree["scheduler"] = configio.converter.unstructure(preset)
    for name, value in values.items():
        if not name.startswith("policy."):
            _set(tree, name, value)
    cfg = _structure(tree, source)
    if cfg.save_checkpoint_to_hub and not (cfg.policy is not None and cfg.policy.repo_id):
        raise UsageError(
            "--save_checkpoint_to_hub=true uploads each checkpoint to the policy's repository: give "
            "--policy.repo_id=<user>/<name>"
        )
    if cfg.save_checkpoint_to_hub and not cfg.save_checkpoint:
        raise UsageError(
            "--save_checkpoint_to_hub=true with --save_checkpoint=false: no checkpoint would be written to "
            "upload; drop one of them"
        )
    if not cfg.use_policy_training_preset and tree.get("policy") is not None:
        missing = [f"--{name}.type" for name in ("optimizer", "scheduler") if getattr(cfg, name) is None]
        if missing:
            raise UsageError(
                "--use_policy_training_preset=false takes no optimizer or scheduler from the policy: give "
                f"{' and '.join(missing)} (e.g. --optimizer.type=adamw "
                "--scheduler.type=cosine_decay_with_warmup), or leave the presets on"
            )
    return BuildResult(cfg, config_path, tuple(messages))
