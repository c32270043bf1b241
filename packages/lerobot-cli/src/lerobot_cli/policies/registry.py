"""Policy registry: built-in names, entry-point plugins, and in-process registration.

Only config classes are imported to list or parse policies (no torch); each carries its
:class:`~lerobot_cli.policies.spec.PolicySpec` as ``spec``, whose model class is imported when a run
builds the policy. A config class without a spec is refused when it is registered or looked up, not
halfway into a run. Third-party packages register with an entry point in the group
``lerobot_cli.policies`` whose value is the config class:

    [project.entry-points."lerobot_cli.policies"]
    my_policy = "my_pkg.config:MyPolicyConfig"
"""

from __future__ import annotations

import importlib
import importlib.util
from importlib.metadata import entry_points

from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.spec import PolicySpec

ENTRY_POINT_GROUP = "lerobot_cli.policies"

_BUILTIN: dict[str, str] = {
    "act": "lerobot_cli.policies.act.config:ACTConfig",
    "diffusion": "lerobot_cli.policies.diffusion.config:DiffusionConfig",
    "fastwam": "lerobot_cli.policies.fastwam.config:FastWAMConfig",
    "mlp": "lerobot_cli.policies.mlp.config:MLPConfig",
    "pi0": "lerobot_cli.policies.pi0.config:PI0Config",
    "pi05": "lerobot_cli.policies.pi05.config:PI05Config",
    "smolvla": "lerobot_cli.policies.smolvla.config:SmolVLAConfig",
}
_REGISTERED: dict[str, type[PolicyConfig]] = {}


class UnknownPolicyError(ValueError):
    pass


def _import(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _plugin_targets() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def register(cls: type[PolicyConfig]) -> type[PolicyConfig]:
    """Class decorator registering a config class under its ``type`` in this process."""
    if not cls.type:
        raise ValueError(f"{cls.__name__} must set the class variable `type` to register")
    if not isinstance(cls.spec, PolicySpec):
        raise TypeError(f"{cls.__name__} must set the class variable `spec` (a PolicySpec) to register")
    _REGISTERED[cls.type] = cls
    return cls


def available() -> list[str]:
    names = set(_REGISTERED) | set(_plugin_targets())
    names |= {name for name, target in _BUILTIN.items() if _importable(target.partition(":")[0])}
    return sorted(names)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def config_class(name: str) -> type[PolicyConfig]:
    if name in _REGISTERED:
        return _REGISTERED[name]
    target = _BUILTIN.get(name) or _plugin_targets().get(name)
    if target is None:
        raise UnknownPolicyError(
            f"--policy.type: invalid choice {name!r} (choose from {', '.join(available())})"
        )
    try:
        cls = _import(target)
    except ModuleNotFoundError as exc:
        raise UnknownPolicyError(
            f"--policy.type={name}: its config {target} cannot be imported ({exc})"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, PolicyConfig)) or cls.type != name:
        raise UnknownPolicyError(f"--policy.type={name}: {target} is not a PolicyConfig with type={name!r}")
    if not isinstance(cls.spec, PolicySpec):
        raise UnknownPolicyError(
            f"--policy.type={name}: {target} sets no `spec` (a PolicySpec): the runner "
            f"reads the policy's model class, wrap units and needs from it"
        )
    return cls


def spec_of(config: PolicyConfig | type[PolicyConfig]) -> PolicySpec:
    """The contract of ``config``'s policy type: what the runner reads instead of probing the classes."""
    cls = config if isinstance(config, type) else type(config)
    if not isinstance(cls.spec, PolicySpec):
        raise UnknownPolicyError(f"{cls.__name__} sets no `spec` (a PolicySpec)")
    return cls.spec


def state_dict_adapter(config: PolicyConfig):
    """The spec's ``function(policy, state) -> state`` for weights files in another layout, or None."""
    target = spec_of(config).state_dict_adapter
    return _import(target) if target else None


def policy_class(config: PolicyConfig) -> type:
    """The ``torch.nn.Module`` class that implements ``config`` (imports torch)."""
    return _import(spec_of(config).model)
