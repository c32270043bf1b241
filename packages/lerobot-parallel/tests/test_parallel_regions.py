"""Activation checkpointing and compile of the plan's blocks in one process: what the plan chooses and
refuses, gradients against the plain model, saved-activation bytes, parameter names, inductor on CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from lerobot_parallel import (
    AcceleratorConfig,
    FSDPConfig,
    GradientAccumulationConfig,
    ParallelismConfig,
    ParallelismError,
)
from lerobot_parallel.config import ActivationCheckpointingConfig, CompileConfig
from lerobot_parallel.errors import ShardingError
from lerobot_parallel.plan import build_plan
from lerobot_parallel.regions import Region
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.testing import BlockRegressor, JointTowers, PlainRegressor, saved_tensor_bytes
from lerobot_parallel.wrap import wrap_model

SINGLE = ParallelRuntime.preview(ParallelismConfig())


def accelerator(mode: str = "none", **compile_fields) -> AcceleratorConfig:
    return AcceleratorConfig(
        activation_checkpointing=ActivationCheckpointingConfig(mode), compile=CompileConfig(**compile_fields)
    )


def regression_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"x": torch.randn(16, 8, generator=g), "y": torch.randn(16, 4, generator=g)}


def run(model: torch.nn.Module, acc: AcceleratorConfig, batch: dict) -> tuple[float, dict, int, object]:
    """One forward+backward through ``wrap_model``: loss, gradients by name,
    bytes saved for backward, plan."""
    plan = build_plan(model, SINGLE, acc)
    wrapped = wrap_model(model, SINGLE, plan).model
    (loss, _), saved = saved_tensor_bytes(lambda: wrapped(batch))
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}, saved, plan


@pytest.mark.parametrize("mode", ["full", "selective"])
@pytest.mark.parametrize(
    "model_fn",
    [lambda: BlockRegressor(depth=6), lambda: JointTowers(depth=4)],
    ids=["blocks", "joint-towers"],
)
def test_checkpointing_keeps_gradients_and_saves_fewer_bytes(mode, model_fn):
    batch = regression_batch() if not isinstance(model_fn(), JointTowers) else JointTowers.batch(8, 0)
    loss0, grads0, bytes0, _ = run(model_fn(), accelerator(), batch)
    loss1, grads1, bytes1, plan = run(model_fn(), accelerator(mode), batch)
    assert plan.blocks and plan.activation_checkpointing == mode
    assert loss1 == loss0
    for name, g in grads0.items():  # bitwise: the recomputation repeats the same ops on the same values
        torch.testing.assert_close(grads1[name], g, rtol=0, atol=0, msg=name)
    # full keeps each block's input only; selective also its matmul outputs, and recomputes the rest
    assert bytes1 < (0.25 if mode == "full" else 0.75) * bytes0, (bytes0, bytes1)


def test_grouped_units_are_one_region_and_the_joint_method_is_checkpointed():
    model = JointTowers(depth=3)
    plan = build_plan(model, SINGLE, accelerator("full"))
    assert [b.paths for b in plan.blocks] == [
        ("main.0", "side.0"),
        ("main.1", "side.1"),
        ("main.2", "side.2"),
    ]
    keys = list(model.state_dict())
    wrap_model(model, SINGLE, plan)
    assert list(model.state_dict()) == keys  # nothing re-parented: checkpoints keep their names
    region = model.main[0].__dict__["joint"]
    assert isinstance(region, Region) and region.module is model.main[0] and region.name == "joint"
    assert repr(region) == "Region(MainTowerLayer.joint, checkpoint=full)"
    with pytest.raises(ShardingError, match="already applied"):
        wrap_model(model, SINGLE, plan)


def test_a_deep_copy_runs_its_own_weights():
    """An EMA shadow is a deep copy: its checkpointed blocks must run the copy's parameters,
    not the original's."""
    model = BlockRegressor(depth=2)
    wrap_model(model, SINGLE, build_plan(model, SINGLE, accelerator("full")))
    shadow = copy.deepcopy(model)
    assert shadow.blocks[0].__dict__["forward"].module is shadow.blocks[0]
    with torch.no_grad():
        for p in shadow.parameters():
            p.add_(0.5)
    batch = regression_batch()
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            plain = BlockRegressor(depth=2)
            plain.load_state_dict(shadow.state_dict())
            assert torch.equal(shadow(batch)[0], plain(batch)[0])
            assert not torch.equal(shadow(batch)[0], model(batch)[0])


def compiled_graphs() -> int:
    import torch._dynamo

    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.fixture
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def test_inductor_regional_compile_on_cpu_matches_eager(fresh_dynamo):
    """inductor (C++ kernels on CPU), with full checkpointing inside, on the joint towers (the block model's
    probe writes a dict, a side effect dynamo will not trace inside a checkpoint: it would run eager)."""
    batch = JointTowers.batch(8, 0)
    loss0, grads0, _, _ = run(JointTowers(depth=2), accelerator(), batch)
    loss1, grads1, _, plan = run(JointTowers(depth=2), accelerator("full", enabled=True), batch)
    assert compiled_graphs() == 1  # one graph for both blocks: identical blocks share it
    assert plan.describe_regions() == [
        "Activation checkpointing: full, on 2 block(s) (MainTowerLayer+SideTowerLayer x2)",
        (
            "Compile: torch.compile backend=inductor mode=default, regional, each of 2 block(s) "
            "(MainTowerLayer+SideTowerLayer x2)"
        ),
    ]
    assert loss1 == pytest.approx(loss0, rel=1e-5)
    for name, g in grads0.items():
        torch.testing.assert_close(grads1[name], g, rtol=1e-5, atol=1e-5, msg=name)


def test_identical_blocks_share_one_compiled_graph(fresh_dynamo):
    run(
        JointTowers(depth=5),
        accelerator("selective", enabled=True, backend="aot_eager"),
        JointTowers.batch(8, 0),
    )
    assert compiled_graphs() == 1


def test_unsharded_regions_need_declared_blocks():
    with pytest.raises(
        ShardingError,
        match=r"^accelerator\.activation_checkpointing\.mode=full apply to the "
        r"policy's blocks, and none could be chosen: FSDP needs wrap units",
    ):
        build_plan(PlainRegressor(), SINGLE, accelerator("full"))
    # the unit flags choose them as they choose FSDP units
    acc = AcceleratorConfig(
        activation_checkpointing=ActivationCheckpointingConfig("full"), fsdp=FSDPConfig(wrap_modules=["Head"])
    )
    assert [b.path for b in build_plan(PlainRegressor(), SINGLE, acc).blocks] == ["head"]
    assert build_plan(PlainRegressor(), SINGLE, accelerator()).blocks == ()


def test_nested_units_checkpoint_only_the_outermost():
    acc = AcceleratorConfig(
        activation_checkpointing=ActivationCheckpointingConfig("full"),
        fsdp=FSDPConfig(wrap_modules=["Head", "LayerNorm"]),
    )
    plan = build_plan(BlockRegressor(), SINGLE, acc)
    assert [b.path for b in plan.blocks] == ["head"]


def test_refusals_name_the_setting():
    with pytest.raises(
        ParallelismError, match=r"accelerator\.activation_checkpointing\.mode: invalid choice 'some'"
    ):
        ActivationCheckpointingConfig("some")
    with pytest.raises(ParallelismError, match=r"accelerator\.compile\.mode: invalid choice"):
        CompileConfig(mode="fast")
    with pytest.raises(
        ParallelismError,
        match=r"accelerator\.compile\.mode=reduce-overhead captures CUDA graphs.*"
        r"gradient_accumulation\.steps=2",
    ):
        AcceleratorConfig(
            compile=CompileConfig(enabled=True, mode="reduce-overhead"),
            gradient_accumulation=GradientAccumulationConfig(steps=2),
        )
    AcceleratorConfig(
        compile=CompileConfig(enabled=True, mode="max-autotune-no-cudagraphs"),
        gradient_accumulation=GradientAccumulationConfig(steps=2),
    )
    with pytest.raises(
        ShardingError,
        match=r"accelerator\.compile\.backend=nope: torch\.compile has no such backend; "
        r"valid: .*inductor",
    ):
        build_plan(BlockRegressor(), SINGLE, accelerator(enabled=True, backend="nope"))
    fsdp = ParallelRuntime.preview(ParallelismConfig(dp_shard=2))
    with pytest.raises(
        ShardingError,
        match=r"accelerator\.compile\.regional=false compiles the whole policy, which "
        r"fsdp sharding does not support",
    ):
        build_plan(BlockRegressor(), fsdp, accelerator(enabled=True, regional=False))
    sharded = build_plan(BlockRegressor(), fsdp, accelerator("selective"))
    assert [b.path for b in sharded.blocks] == [u.path for u in sharded.units]
    assert "Activation checkpointing: selective, on 3 block(s) (Block x3)" in sharded.describe()
