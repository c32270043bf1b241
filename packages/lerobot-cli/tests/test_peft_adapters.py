"""PEFT wrapping in one process: flags → LoraConfig, base dtype rules, adapter files, load back,
plan names."""

from __future__ import annotations

import json

import pytest
import torch
from lerobot_ckpt.pretrained import stored_float_dtype
from lerobot_cli.features import PolicyFeature
from lerobot_cli.peft.adapters import (
    adapter_state,
    default_target_modules,
    load_adapter_policy,
    lora_config,
    save_adapter_config,
    wrap_with_peft,
)
from lerobot_cli.peft.basefile import (
    PeftSetupError,
    base_reference,
    check_base_precision,
    is_adapter_dir,
    recorded_base,
)
from lerobot_cli.peft.config import PeftConfig
from lerobot_cli.policies.diffusion.config import DiffusionConfig
from lerobot_cli.policies.mlp.config import MLPConfig
from lerobot_cli.policies.mlp.modeling import MLPPolicy
from lerobot_cli.policies.pretrained import load_pretrained, save_pretrained
from lerobot_parallel.config import AcceleratorConfig, FSDPConfig, ParallelismConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime
from safetensors.torch import save_file


def _config() -> MLPConfig:
    return MLPConfig(
        input_features={"observation.state": PolicyFeature("STATE", (4,))},
        output_features={"action": PolicyFeature("ACTION", (3,))},
        hidden_dim=16,
        n_blocks=2,
    )


@pytest.fixture
def base(tmp_path):
    torch.manual_seed(0)
    return save_pretrained(MLPPolicy(_config()), _config(), tmp_path / "base")


def _batch():
    g = torch.Generator().manual_seed(1)
    return {"observation.state": torch.randn(4, 4, generator=g), "action": torch.randn(4, 3, generator=g)}


def test_flags_become_a_lora_config():
    policy = MLPPolicy(_config())
    default = lora_config(PeftConfig(r=8), policy.config)
    assert default.r == 8 and default.lora_alpha == 8 and default.target_modules == r"blocks\.\d+\.linear"
    assert default.modules_to_save is None and default.init_lora_weights is True
    explicit = lora_config(
        PeftConfig(
            r=4,
            lora_alpha=16,
            lora_dropout=0.1,
            target_modules=("linear", "input_proj"),
            full_training_modules=("action_head",),
            init_type="gaussian",
        ),
        policy.config,
    )
    assert explicit.lora_alpha == 16 and explicit.lora_dropout == 0.1
    assert set(explicit.target_modules) == {"linear", "input_proj"} and explicit.modules_to_save == [
        "action_head"
    ]
    assert explicit.init_lora_weights == "gaussian"
    assert lora_config(PeftConfig(init_type="false"), policy.config).init_lora_weights is False


def test_a_policy_without_default_targets_asks_for_the_flag():
    with pytest.raises(
        PeftSetupError,
        match="--policy.type=diffusion declares no default LoRA targets: pass --peft.target_modules",
    ):
        default_target_modules(DiffusionConfig())


def test_only_adapters_train_and_the_files_round_trip(base, tmp_path):
    _, policy = load_pretrained(base)
    model = wrap_with_peft(
        policy.train(),
        PeftConfig(r=2, full_training_modules=("action_head",)),
        base_dir=base,
        mixed_precision="no",
    )
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n or ".modules_to_save." in n for n in trainable)
    optimizer = torch.optim.AdamW([p for g in model.get_optim_params() for p in g["params"]], lr=0.05)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(trainable)
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    for _ in range(3):
        loss, _ = model(_batch())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(p, frozen_before[n]) for n, p in model.named_parameters() if not p.requires_grad)
    out = tmp_path / "adapter"
    out.mkdir()
    state = adapter_state(model)(model.state_dict())
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "adapter_model.safetensors"))
    save_adapter_config(model, out)
    assert is_adapter_dir(out) and recorded_base(out) == str(base.resolve())
    model.eval()
    with torch.no_grad():
        expected = model.get_base_model().predict_action_chunk(_batch())
        _, loaded = load_adapter_policy(out, config=_config())
        assert torch.equal(loaded.get_base_model().predict_action_chunk(_batch()), expected)


def test_a_bf16_base_keeps_its_dtype_under_mixed_precision_and_is_refused_without(base):
    weights = base / "model.safetensors"
    tensors = {k: v.to(torch.bfloat16) for k, v in load_pretrained(base)[1].state_dict().items()}
    save_file(tensors, str(weights))
    assert stored_float_dtype(weights) == "bfloat16"
    with pytest.raises(PeftSetupError, match="--accelerator.mixed_precision=bf16"):
        wrap_with_peft(load_pretrained(base)[1], PeftConfig(r=2), base_dir=base, mixed_precision="no")
    model = wrap_with_peft(
        load_pretrained(base)[1],
        PeftConfig(r=2, full_training_modules=("action_head",)),
        base_dir=base,
        mixed_precision="bf16",
    )
    dtypes = {p.requires_grad: set() for p in model.parameters()}
    for p in model.parameters():
        dtypes[p.requires_grad].add(p.dtype)
    assert dtypes == {True: {torch.float32}, False: {torch.bfloat16}}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = model(_batch())
    loss.backward()
    assert all(
        p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters() if p.requires_grad
    )


def test_base_reference_names_the_hub_repo_of_a_cached_snapshot(tmp_path):
    snapshot = tmp_path / "hub" / "models--someone--act_base" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    assert base_reference(snapshot) == "someone/act_base"
    assert base_reference(tmp_path) == str(tmp_path.resolve())


def test_base_precision_rule():
    check_base_precision("float32", "no", "x")
    check_base_precision("bfloat16", "bf16", "x")
    with pytest.raises(PeftSetupError, match="mixed_precision=fp16"):
        check_base_precision("float16", "no", "x")


def test_recorded_base_errors_name_the_file(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    with pytest.raises(PeftSetupError, match="records no base_model_name_or_path"):
        recorded_base(tmp_path)


def test_ignored_modules_patterns_see_peft_names(base):
    """``--accelerator.fsdp.ignored_modules`` is a full match against the PEFT model's module names,
    which start with ``base_model.model.``: a pattern written for the bare policy must start with ``.*``."""
    _, policy = load_pretrained(base)
    model = wrap_with_peft(policy, PeftConfig(r=2), base_dir=base, mixed_precision="no")
    sharded = ParallelRuntime.preview(ParallelismConfig(dp_shard=2).resolve(2))

    def ignoring(pattern: str) -> AcceleratorConfig:
        return AcceleratorConfig(fsdp=FSDPConfig(ignored_modules=pattern))

    plan = build_plan(model, sharded, ignoring(r".*action_head"), default_wrap_modules=["MLPBlock"])
    assert [m.path for m in plan.ignored] == ["base_model.model.action_head"]
    assert [m.path for m in plan.units][:1] == ["base_model.model.blocks.0"]
    with pytest.raises(Exception, match="action_head"):
        build_plan(model, sharded, ignoring("action_head"), default_wrap_modules=["MLPBlock"])
