"""The policy contract: ``PolicySpec`` is validated where it is written, a config class without one is
refused before a run, and the runner's wrap units, PEFT targets and init-only fields come from it
(not from attributes of the model class)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import pytest
from attrs import define
from lerobot_cli.cli.render import as_flags
from lerobot_cli.peft.adapters import default_target_modules
from lerobot_cli.policies import PolicyConfig, PolicySpec, registry
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.weights import without_init_only_fields
from lerobot_cli.workload import sharding_plan
from lerobot_parallel import ShardingError
from lerobot_parallel.config import AcceleratorConfig, FSDPConfig, ParallelismConfig
from lerobot_parallel.runtime import ParallelRuntime
from torch import nn


def test_spec_names_classes_as_module_colon_name():
    with pytest.raises(ValueError, match=r"PolicySpec.model must be 'module:Name', got 'my_pkg.Policy'"):
        PolicySpec(model="my_pkg.Policy")
    with pytest.raises(ValueError, match=r"PolicySpec.processors must be 'module:Name'"):
        PolicySpec(model="my_pkg:Policy", processors="my_pkg.steps")


def test_a_unit_group_names_wrap_units_only():
    with pytest.raises(ValueError, match=r"unit_groups names \['Expert'\] that wrap_units lacks"):
        PolicySpec(model="m:P", wrap_units=("Layer",), unit_groups=[("Layer", "Expert")])
    spec = PolicySpec(model="m:P", wrap_units=["Layer", "Expert"], unit_groups=[["Layer", "Expert"]])
    assert spec.wrap_units == ("Layer", "Expert") and spec.unit_groups == (("Layer", "Expert"),)


def test_extras_are_lerobot_cli_extras():
    with pytest.raises(ValueError, match=r"PolicySpec.extras names \['vision'\], not lerobot-cli extras"):
        PolicySpec(model="m:P", extras=("vision",))
    assert registry.spec_of(registry.config_class("pi05")).extras == ("pi",)


def test_a_config_without_a_spec_is_refused_at_registration():
    @define(frozen=True, kw_only=True)
    class NoSpec(PolicyConfig):
        type: ClassVar[str] = "no_spec_test"

    with pytest.raises(TypeError, match="NoSpec must set the class variable `spec`"):
        registry.register(NoSpec)
    with pytest.raises(registry.UnknownPolicyError, match="NoSpec sets no `spec`"):
        registry.spec_of(NoSpec())


_PLUGIN = """
from typing import ClassVar

from attrs import define
from lerobot_cli.policies import PolicyConfig
from lerobot_cli.policies.mlp.config import MLPConfig


@define(frozen=True, kw_only=True)
class NoSpecPlugin(PolicyConfig):
    type: ClassVar[str] = "no_spec_plugin"


@define(frozen=True, kw_only=True)
class WithSpecPlugin(PolicyConfig):
    type: ClassVar[str] = "with_spec_plugin"
    spec = MLPConfig.spec
"""


def test_a_plugin_config_without_a_spec_is_refused_at_lookup(tmp_path, monkeypatch):
    """An entry point (or built-in) names its config class: ``config_class`` imports it and refuses one
    without a spec there, before a run reads the missing model class halfway in."""
    (tmp_path / "spec_plugin_test.py").write_text(_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    targets = {
        "no_spec_plugin": "spec_plugin_test:NoSpecPlugin",
        "with_spec_plugin": "spec_plugin_test:WithSpecPlugin",
    }
    monkeypatch.setattr(registry, "_plugin_targets", lambda: targets)
    with pytest.raises(registry.UnknownPolicyError) as err:
        registry.config_class("no_spec_plugin")
    assert str(err.value) == (
        "--policy.type=no_spec_plugin: spec_plugin_test:NoSpecPlugin sets no `spec` (a PolicySpec): the "
        "runner reads the policy's model class, wrap units and needs from it"
    )
    # the same path accepts the class once it carries a spec
    assert registry.config_class("with_spec_plugin").spec is registry.config_class("mlp").spec


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


class SpecOnlyPolicy(nn.Module):
    """Declares nothing for FSDP itself: the plan can only find ``Block`` through the spec."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(4, 2)


@define(frozen=True, kw_only=True)
class SpecOnlyConfig(PolicyConfig):
    type: ClassVar[str] = "spec_only_test"
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="spec_test:SpecOnlyPolicy", wrap_units=("Block",), peft_targets=r"blocks\.\d+\.linear"
    )


def test_the_sharding_plan_takes_the_wrap_units_from_the_spec():
    config = SpecOnlyConfig()
    cfg = SimpleNamespace(policy=config, accelerator=AcceleratorConfig())
    plan = sharding_plan(cfg, SpecOnlyPolicy(config), FSDP2)
    assert [u.path for u in plan.units] == ["blocks.0", "blocks.1", "blocks.2"]
    assert plan.unit_source == "the spec_only_test policy's PolicySpec.wrap_units"


FSDP2 = ParallelRuntime.preview(ParallelismConfig(dp_shard=2).resolve(2))


def test_no_forward_modules_cannot_be_wrap_units():
    with pytest.raises(ValueError, match=r"no_forward_modules names \['Layer'\] that wrap_units also lists"):
        PolicySpec(model="m:P", wrap_units=("Layer", "Head"), no_forward_modules=["Layer"])
    spec = PolicySpec(model="m:P", wrap_units=("Layer",), no_forward_modules=["Tower"])
    assert spec.no_forward_modules == ("Tower",) and PolicySpec(model="m:P").no_forward_modules == ()
    pi0 = registry.spec_of(registry.config_class("pi0"))
    assert "PaliGemmaWithExpert" in pi0.no_forward_modules


class AttributesOnlyPolicy(SpecOnlyPolicy):
    """Declares for lerobot-parallel what its spec does not: the runner must not read any of it."""

    _fsdp_wrap_modules: ClassVar[list[str]] = ["Block"]
    _fsdp_no_forward_modules: ClassVar[tuple[str, ...]] = ("Linear",)


@define(frozen=True, kw_only=True)
class NoUnitsConfig(PolicyConfig):
    type: ClassVar[str] = "no_units_test"
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="spec_test:AttributesOnlyPolicy", no_forward_modules=("Block",)
    )


def test_the_sharding_plan_reads_no_fsdp_attribute_of_the_model_class():
    """The spec's empty wrap_units and its no_forward_modules are passed as they are: the class's own
    ``_fsdp_wrap_modules`` / ``_fsdp_no_forward_modules`` (lerobot-parallel's fallback) are not read, and
    the refusal the user sees names the spec's field, with flags for the two settings."""
    config = NoUnitsConfig()
    cfg = SimpleNamespace(policy=config, accelerator=AcceleratorConfig())
    with pytest.raises(ShardingError) as err:
        sharding_plan(cfg, AttributesOnlyPolicy(config), FSDP2)
    line = as_flags(str(err.value))
    assert (
        "AttributesOnlyPolicy gives none: the no_units_test policy's PolicySpec.wrap_units lists no block "
        "class and neither --accelerator.fsdp.wrap_modules nor --accelerator.fsdp.min_num_params" in line
    ), line
    assert "_fsdp_wrap_modules" not in line and "\n" not in line
    by_name = SimpleNamespace(
        policy=config, accelerator=AcceleratorConfig(fsdp=FSDPConfig(wrap_modules=("Block",)))
    )
    with pytest.raises(ShardingError, match=r"Block never runs its forward\(\) in AttributesOnlyPolicy"):
        sharding_plan(by_name, AttributesOnlyPolicy(config), FSDP2)
    by_size = SimpleNamespace(
        policy=config, accelerator=AcceleratorConfig(fsdp=FSDPConfig(min_num_params=10))
    )
    plan = sharding_plan(by_size, AttributesOnlyPolicy(config), FSDP2)  # Linear is a unit: the spec allows it
    assert [u.path for u in plan.units] == ["blocks.0.linear", "blocks.1.linear", "blocks.2.linear", "head"]


def test_peft_targets_and_init_only_fields_come_from_the_spec():
    assert default_target_modules(SpecOnlyConfig()) == r"blocks\.\d+\.linear"
    assert ACTConfig.spec.init_only_fields == ("pretrained_backbone_weights",)
    assert without_init_only_fields(ACTConfig()).pretrained_backbone_weights is None


def test_each_builtin_policy_is_one_folder():
    """Model and processor step lists both live in the policy's own folder (pi0/pi05's included), for every
    built-in the registry lists (not a copy of its names: a new one is held to it too)."""
    assert set(registry._BUILTIN) >= {"act", "diffusion", "fastwam", "mlp", "pi0", "pi05", "smolvla"}
    for name in registry._BUILTIN:
        spec = registry.spec_of(registry.config_class(name))
        module, _, cls = spec.model.partition(":")
        assert module.startswith(f"lerobot_cli.policies.{name}.") and cls.endswith("Policy"), spec.model
        assert not spec.processors or spec.processors.startswith(f"lerobot_cli.policies.{name}.processors:")
    assert registry.spec_of(registry.config_class("pi05")).processors.endswith(":pi05_processor_steps")


def test_every_config_hook_is_in_the_readmes_list_of_hooks():
    """What is not in the spec is a hook the README lists (eval_loss_description included: ACT's answer
    depends on use_vae and kl_weight, so it cannot be a static spec field)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    hooks_text = readme[
        readme.index("Hooks, each declared on `PolicyConfig`") : readme.index("- the **spec**")
    ]
    hooks = [
        name
        for name, value in vars(PolicyConfig).items()
        if callable(value) and not name.startswith("_") and name != "features_of"
    ]
    assert "eval_loss_description" in hooks and "optimizer_preset" in hooks
    missing = [name for name in hooks if f"`{name}()`" not in hooks_text]
    assert not missing, f"PolicyConfig hooks missing from the README's list: {missing}"
