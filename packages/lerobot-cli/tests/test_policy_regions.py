"""Activation checkpointing and compile applied to the policies' wrap units in one process: ACT at its
default size (saved bytes, gradients), with PEFT, regional and whole-policy compile against eager, and the
policy's own gradient_checkpointing flag read as the engine's full mode."""

from __future__ import annotations

import pytest
import torch
from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.act.modeling import ACTPolicy
from lerobot_parallel import AcceleratorConfig, ParallelismConfig
from lerobot_parallel.config import ActivationCheckpointingConfig, CompileConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.testing import saved_tensor_bytes
from lerobot_parallel.wrap import wrap_model

RUNTIME = ParallelRuntime.preview(ParallelismConfig())
CAM = (3, 64, 64)  # the demo dataset's camera


def act_config(**overrides) -> ACTConfig:
    inputs = {
        "observation.state": PolicyFeature("STATE", (2,)),
        "observation.images.top": PolicyFeature("VISUAL", CAM),
    }
    return ACTConfig(
        input_features=inputs,
        output_features={"action": PolicyFeature("ACTION", (2,))},
        pretrained_backbone_weights=None,
        **overrides,
    )


def act_batch(cfg: ACTConfig, batch_size: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "observation.state": torch.randn(batch_size, 2, generator=g),
        "observation.images.top": torch.rand(batch_size, *CAM, generator=g),
        "action": torch.randn(batch_size, cfg.chunk_size, 2, generator=g),
        "action_is_pad": torch.zeros(batch_size, cfg.chunk_size, dtype=torch.bool),
    }


def train_once(model_fn, accelerator: AcceleratorConfig, batch, seed: int = 0):
    """Loss, gradients by name and saved bytes of one forward+backward of a fresh model (same seeds)."""
    torch.manual_seed(seed)
    model = model_fn()
    plan = build_plan(model, RUNTIME, accelerator)
    run = wrap_model(model, RUNTIME, plan).model
    torch.manual_seed(seed + 1)  # dropout, VAE sampling
    (loss, _), nbytes = saved_tensor_bytes(lambda: run(batch))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, nbytes, plan


def ac(mode: str) -> AcceleratorConfig:
    return AcceleratorConfig(activation_checkpointing=ActivationCheckpointingConfig(mode))


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_act_default_checkpointing_keeps_gradients_and_halves_saved_bytes(mode):
    cfg = act_config()  # LeRobot's default sizes: dim 512, 4+1 layers, 4 VAE layers, chunk 100
    batch = act_batch(cfg)
    loss0, grads0, bytes0, _ = train_once(lambda: ACTPolicy(cfg), ac("none"), batch)
    loss1, grads1, bytes1, plan = train_once(lambda: ACTPolicy(cfg), ac(mode), batch)
    assert {b.class_name for b in plan.blocks} == {"ACTEncoderLayer", "ACTDecoderLayer"}
    assert len(plan.blocks) == 9  # 4 encoder + 1 decoder + 4 VAE encoder layers
    assert loss1 == loss0
    assert grads1.keys() == grads0.keys()
    for name, g in grads0.items():
        torch.testing.assert_close(
            grads1[name], g, rtol=0, atol=0, msg=name
        )  # bitwise: the same ops recomputed
    assert bytes1 <= 0.5 * bytes0, (bytes0, bytes1)


def test_checkpointing_with_lora_trains_only_adapters_with_the_same_gradients():
    from peft import LoraConfig, get_peft_model

    cfg = act_config(dim_model=32, n_heads=4, dim_feedforward=64, chunk_size=5, n_action_steps=5)
    batch = act_batch(cfg)

    def lora():
        model = get_peft_model(ACTPolicy(cfg), LoraConfig(r=4, target_modules=["linear1", "linear2"]))
        return model

    def run(mode):
        torch.manual_seed(0)
        model = lora()
        plan = build_plan(model, RUNTIME, ac(mode), default_wrap_modules=ACTPolicy._fsdp_wrap_modules)
        wrapped = wrap_model(model, RUNTIME, plan).model
        torch.manual_seed(1)
        loss, _ = wrapped(batch)
        loss.backward()
        return plan, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    _, plain = run("none")
    plan, checkpointed = run("full")
    assert plan.blocks and all(b.path.startswith("base_model.model.") for b in plan.blocks)
    assert plain.keys() == checkpointed.keys() and all("lora_" in n for n in plain)
    for name, g in plain.items():
        torch.testing.assert_close(
            checkpointed[name], g, rtol=0, atol=0, msg=name
        )  # bitwise: the same ops recomputed


@pytest.mark.parametrize("regional", [True, False])
def test_compiled_act_matches_eager(regional):
    """Dynamo + AOTAutograd (backend aot_eager: inductor's own kernels are checked on a smaller model in
    lerobot-parallel's tests, at ~15 s per graph on 2 cores); tolerance 1e-5 relative/absolute."""
    cfg = act_config(dim_model=32, n_heads=4, dim_feedforward=64, chunk_size=5, n_action_steps=5, dropout=0.0)
    batch = act_batch(cfg)
    compiled = AcceleratorConfig(
        compile=CompileConfig(enabled=True, backend="aot_eager", regional=regional),
        activation_checkpointing=ActivationCheckpointingConfig("full" if regional else "none"),
    )
    import torch._dynamo

    loss0, grads0, _, _ = train_once(lambda: ACTPolicy(cfg), AcceleratorConfig(), batch)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    loss1, grads1, _, plan = train_once(lambda: ACTPolicy(cfg), compiled, batch)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert graphs >= (3 if regional else 1), graphs  # the encoder, VAE encoder and decoder layers did compile
    assert plan.describe_regions()[-1].endswith(
        "each of 9 block(s) (ACTEncoderLayer x8, ACTDecoderLayer x1)" if regional else "the whole policy"
    )
    assert loss1 == pytest.approx(loss0, rel=1e-5, abs=1e-6)
    for name, g in grads0.items():
        torch.testing.assert_close(grads1[name], g, rtol=1e-5, atol=1e-5, msg=name)


def test_policy_gradient_checkpointing_flag_is_the_engine_full_mode():
    from lerobot_cli.cli.argv import split_argv
    from lerobot_cli.cli.build import build_train_config
    from lerobot_cli.workload import effective_accelerator

    def cfg(*flags):
        return build_train_config(
            split_argv(["--policy.type=pi0", "--dataset.repo_id=x/y", *flags]).flags
        ).config

    assert effective_accelerator(cfg()).activation_checkpointing.mode == "none"
    assert (
        effective_accelerator(cfg("--policy.gradient_checkpointing=true")).activation_checkpointing.mode
        == "full"
    )
    explicit = cfg(
        "--policy.gradient_checkpointing=true", "--accelerator.activation_checkpointing.mode=selective"
    )
    assert effective_accelerator(explicit).activation_checkpointing.mode == "selective"
