"""The sharding plan (dry-run object), its memory arithmetic and the precision-policy rules."""

from __future__ import annotations

import pytest
import torch
from lerobot_parallel import (
    AcceleratorConfig,
    DDPConfig,
    FSDPConfig,
    MixedPrecisionPolicyConfig,
    ParallelismConfig,
    ShardingError,
    build_plan,
)
from lerobot_parallel.fsdp_precision import resolve_sharded_precision
from lerobot_parallel.memory import estimate_memory, padded_shard_numel
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.testing import BlockRegressor, TiedTokenModel
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy


def preview(dp_replicate: int = 1, dp_shard: int = 1) -> ParallelRuntime:
    return ParallelRuntime.preview(ParallelismConfig(dp_replicate=dp_replicate, dp_shard=dp_shard))


def fsdp_settings(mixed_precision: str = "no", **fsdp) -> AcceleratorConfig:
    return AcceleratorConfig(mixed_precision=mixed_precision, fsdp=FSDPConfig(**fsdp))


FSDP2, HSDP = preview(dp_shard=2), preview(dp_replicate=2, dp_shard=2)


def test_fsdp_plan_lists_units_counts_and_checks():
    plan = build_plan(BlockRegressor(), FSDP2)
    assert (plan.mode, plan.mesh_dim_names, plan.mesh_shape) == ("fsdp", ("dp_shard",), (2,))
    assert [(u.path, u.class_name, u.num_params) for u in plan.units] == [
        (f"blocks.{i}", "Block", 634) for i in range(3)
    ]
    assert (plan.root.class_name, plan.root.num_params) == ("BlockRegressor", 117 + 82)
    assert sum(u.num_params for u in plan.units) + plan.root.num_params == sum(
        p.numel() for p in BlockRegressor().parameters()
    )
    text = "\n".join(plan.describe())
    for expected in (
        "fsdp on mesh (dp_shard=2)",
        "blocks.2 (Block): 634 params",
        "<root> (BlockRegressor): 199",
        "Ignored modules: none",
        "Tied weights: none",
        "Estimated per-rank memory",
        "BlockRegressor._fsdp_wrap_modules",
        "CPU offload: no",
    ):
        assert expected in text, (expected, text)


def test_hsdp_plan_shards_over_dp_shard_only():
    fsdp4 = build_plan(BlockRegressor(), preview(dp_shard=4))
    hsdp = build_plan(BlockRegressor(), HSDP)
    fsdp2 = build_plan(BlockRegressor(), FSDP2)
    assert (hsdp.mode, hsdp.mesh_dim_names, hsdp.mesh_shape) == ("hsdp", ("dp_replicate", "dp_shard"), (2, 2))
    assert hsdp.memory == fsdp2.memory  # 1/S of the model per rank, whatever R is
    assert fsdp4.memory.total < fsdp2.memory.total


def test_non_sharded_plans():
    settings = AcceleratorConfig(ddp=DDPConfig(find_unused_parameters=True))
    ddp = build_plan(BlockRegressor(), preview(dp_replicate=2), settings)
    assert ddp.mode == "ddp" and not ddp.units and ddp.memory.ratio == 1.0
    assert ddp.ddp.find_unused_parameters  # the DDP wrapper's settings are part of the plan
    assert "no sharding" in ddp.describe()[0]
    # the policy is not asked for units when nothing is sharded
    assert build_plan(nn.Linear(3, 3), preview()).mode == "single"


def test_padded_shard_sizes():
    assert padded_shard_numel((7, 5), 2) == 4 * 5  # ceil(7/2) rows
    assert padded_shard_numel((8, 5), 4) == 2 * 5
    assert padded_shard_numel((3,), 4) == 1  # some ranks hold padding only
    assert padded_shard_numel((), 2) == 1
    assert padded_shard_numel((7, 5), 1) == 35


def test_memory_estimate_arithmetic():
    lin = nn.Linear(4, 6)  # weight (6,4)=24, bias 6, fp32
    frozen = nn.Linear(4, 3).requires_grad_(False)  # 15 elements, no grads or optimizer state
    est = estimate_memory(
        [*lin.parameters(), *frozen.parameters(), lin.weight], dp_shard=4
    )  # duplicate ignored
    # per rank: weight 2x4=8, bias 2, frozen weight 1x4=4 + bias 1 -> params 15 elements
    assert est.params == 15 * 4 and est.grads == 10 * 4 and est.optimizer == 2 * 10 * 4
    assert est.unsharded_params == 45 * 4 and est.unsharded_grads == 30 * 4
    # the frozen part of params, sharded as the rest: 5 of the 15 elements, 15 of the 45 unsharded
    assert est.frozen_params == 5 * 4 and est.unsharded_frozen_params == 15 * 4
    assert "trainable 40 B" in est.describe_params() and "frozen 20 B (0.333x of the unsharded 60 B" in (
        est.describe_params()
    )
    assert estimate_memory(lin.parameters(), dp_shard=4).describe_params() is None  # nothing frozen
    ign = estimate_memory(lin.parameters(), dp_shard=4, ignored=frozenset({id(lin.weight)}))
    assert ign.params == (24 + 2) * 4  # the ignored weight is whole on every rank
    half = nn.Linear(4, 6).to(torch.bfloat16)
    assert estimate_memory(half.parameters(), dp_shard=1).params == 30 * 2
    assert estimate_memory(half.parameters(), dp_shard=1, upcast_trainable=True).params == 30 * 4
    assert estimate_memory(lin.parameters(), dp_shard=2, optimizer_states=1).optimizer == 15 * 4


def test_estimate_ratio_approaches_one_over_n_for_large_params():
    big = nn.Sequential(nn.Linear(512, 1024), nn.Linear(1024, 512))
    for n in (2, 4, 8):
        assert estimate_memory(big.parameters(), dp_shard=n).ratio <= 1.05 / n


def test_plan_with_ignored_modules_and_precision():
    plan = build_plan(BlockRegressor(), HSDP, fsdp_settings("bf16", ignored_modules="head"))
    assert [(m.path, m.class_name, m.num_params) for m in plan.ignored] == [("head", "Head", 82)]
    assert plan.root.num_params == 117  # the head is no longer the root's
    text = "\n".join(plan.describe())
    assert "gradients averaged over 4 dp ranks" in text and "all-gathered in bfloat16" in text
    assert "derived from accelerator.mixed_precision=bf16" in text


def test_units_inside_ignored_modules_are_dropped_and_all_ignored_is_refused():
    plan = build_plan(
        BlockRegressor(), FSDP2, fsdp_settings(wrap_modules=("Block", "Head"), ignored_modules="head")
    )
    assert [u.path for u in plan.units] == ["blocks.0", "blocks.1", "blocks.2"]
    with pytest.raises(ShardingError, match="lies inside"):
        build_plan(BlockRegressor(), FSDP2, fsdp_settings(ignored_modules="blocks"))


def test_plan_refuses_what_sharding_cannot_do():
    with pytest.raises(ShardingError, match="embed.weight"):
        build_plan(TiedTokenModel(), FSDP2)
    with pytest.raises(ShardingError, match="fp16 is not supported"):
        build_plan(BlockRegressor(), FSDP2, fsdp_settings("fp16", ignored_modules="head"))


def test_many_units_are_grouped_by_class():
    plan = build_plan(BlockRegressor(depth=20), FSDP2)
    lines = plan.describe()
    assert "  Block x20 (634 params each), first blocks.0" in lines
    assert not any(line.startswith("  blocks.") for line in lines)


# ---- precision rules ----------------------------------------------------------------------------


def test_no_mixed_precision_means_no_policy_and_no_upcast():
    sp = resolve_sharded_precision("no")
    assert sp.source == "none" and not sp.upcast_trainable
    assert sp.policies() == (MixedPrecisionPolicy(), MixedPrecisionPolicy())


@pytest.mark.parametrize(("mode", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_derived_policy(mode, dtype):
    unit, root = resolve_sharded_precision(mode).policies()
    assert unit == MixedPrecisionPolicy(
        param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=True
    )
    assert root == MixedPrecisionPolicy(
        param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=False
    )
    assert resolve_sharded_precision(mode).upcast_trainable


def test_explicit_policy_is_built_from_its_fields_only():
    mpp = MixedPrecisionPolicyConfig(param_dtype="bfloat16")
    sp = resolve_sharded_precision("fp16", mpp)  # replaces the policy fp16 would derive
    unit, root = sp.policies()
    assert unit == root == MixedPrecisionPolicy(param_dtype=torch.bfloat16)  # reduce_dtype left to torch
    assert sp.upcast_trainable and "torch" in sp.describe() and "default" in sp.describe()
    full = MixedPrecisionPolicyConfig(
        param_dtype="bfloat16", reduce_dtype="float32", output_dtype="float32", cast_forward_inputs=False
    )
    assert resolve_sharded_precision("no", full).policies()[0] == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16,
        reduce_dtype=torch.float32,
        output_dtype=torch.float32,
        cast_forward_inputs=False,
    )


def test_explicit_policy_needs_param_dtype_and_float16_needs_fp16():
    with pytest.raises(ValueError, match="param_dtype must be set"):
        MixedPrecisionPolicyConfig(reduce_dtype="float32")
    with pytest.raises(ValueError, match="needs accelerator.mixed_precision=fp16"):
        AcceleratorConfig(
            mixed_precision="bf16",
            fsdp=FSDPConfig(mixed_precision_policy=MixedPrecisionPolicyConfig(param_dtype="float16")),
        )
    with pytest.raises(ValueError, match="needs accelerator.mixed_precision=fp16"):
        resolve_sharded_precision(
            "no", MixedPrecisionPolicyConfig(param_dtype="bfloat16", reduce_dtype="float16")
        )
    unit, _ = resolve_sharded_precision("fp16", MixedPrecisionPolicyConfig(param_dtype="float16")).policies()
    assert unit.param_dtype == torch.float16


def test_grouped_units_pair_the_towers_layer_by_layer():
    from lerobot_parallel.testing import JointTowers

    plan = build_plan(JointTowers(), FSDP2)
    assert [(u.paths, u.class_name) for u in plan.units] == [
        (("main.0", "side.0"), "MainTowerLayer+SideTowerLayer"),
        (("main.1", "side.1"), "MainTowerLayer+SideTowerLayer"),
    ]
    assert sum(u.num_params for u in plan.units) + plan.root.num_params == sum(
        p.numel() for p in JointTowers().parameters()
    )
    assert "main.1 + side.1 (MainTowerLayer+SideTowerLayer)" in "\n".join(plan.describe())
    # Naming only the side tower (the naive wrap) still shards each pair as one unit.
    naive = build_plan(JointTowers(), FSDP2, fsdp_settings(wrap_modules=("SideTowerLayer",)))
    assert [u.paths for u in naive.units] == [u.paths for u in plan.units]


def test_grouped_units_refusals():
    from lerobot_parallel.testing import JointTowers

    lopsided = JointTowers()
    lopsided.side.append(type(lopsided.side[0])(11))
    with pytest.raises(ShardingError, match=r"MainTowerLayer x2, SideTowerLayer x3"):
        build_plan(lopsided, FSDP2)
    with pytest.raises(
        ShardingError, match=r"covers side\.0 but not the rest of its grouped unit \(main\.0 \+ side\.0\)"
    ):
        build_plan(JointTowers(), FSDP2, fsdp_settings(ignored_modules=r"side\.0"))


def test_tied_weights_inside_a_grouped_unit_are_fine_across_groups_refused():
    from lerobot_parallel.testing import JointTowers

    inside = JointTowers()
    inside.side[0].mix.weight = inside.main[0].mix.weight
    assert "in main.0" in build_plan(inside, FSDP2).tied.describe()
    across = JointTowers()
    across.side[1].mix.weight = across.main[0].mix.weight
    with pytest.raises(ShardingError, match="tied weights cannot be split"):
        build_plan(across, FSDP2)


def test_mixed_trainable_dtypes_in_one_unit_are_refused_unless_masters_are_fp32():
    model = BlockRegressor()
    model.blocks[1].fc2.to(torch.bfloat16)
    with pytest.raises(
        ShardingError,
        match=r"FSDP unit blocks\.1 holds trainable parameters of several dtypes: "
        r"bfloat16 \(blocks\.1\.fc2\.weight\), float32 \(blocks\.1\.fc1\.weight\)",
    ):
        build_plan(model, FSDP2)
    assert build_plan(model, FSDP2, fsdp_settings("bf16")).units  # bf16 mixed precision: fp32 masters
    model.blocks[1].fc2.requires_grad_(False)
    assert build_plan(model, FSDP2).units  # frozen parameters may differ
