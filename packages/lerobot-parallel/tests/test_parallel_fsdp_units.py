"""Wrap-unit selection, ignored-module matching and the tied-weight check (module tree only, no processes)."""

from __future__ import annotations

from typing import ClassVar

import pytest
from lerobot_parallel import (
    AcceleratorConfig,
    ActivationCheckpointingConfig,
    FSDPConfig,
    ParallelismConfig,
    ShardingError,
    build_plan,
)
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.testing import BlockRegressor, PlainRegressor, TiedTokenModel
from lerobot_parallel.tied_weights import check_tied_weights
from lerobot_parallel.wrap_units import children_first, select_by_size, select_ignored, select_units
from torch import nn

FSDP2 = ParallelRuntime.preview(ParallelismConfig(dp_shard=2))


def test_policy_attribute_is_the_default_source():
    sel = select_units(BlockRegressor(), FSDPConfig())
    assert sel.paths == ("blocks.0", "blocks.1", "blocks.2")
    assert sel.source == "BlockRegressor._fsdp_wrap_modules"


def test_flag_wins_over_the_policy_attribute_and_each_name_must_match():
    sel = select_units(BlockRegressor(), FSDPConfig(wrap_modules=("Block", "Head")))
    assert sel.paths == ("blocks.0", "blocks.1", "blocks.2", "head")
    assert sel.source == "accelerator.fsdp.wrap_modules"
    with pytest.raises(ShardingError) as err:
        select_units(BlockRegressor(), FSDPConfig(wrap_modules=("Block", "TransformerLayer")))
    msg = str(err.value)
    assert "TransformerLayer" in msg and "match no module" in msg
    assert "Block x3" in msg and "Head x1" in msg and "Linear x8" in msg  # the class names present


def test_policy_attribute_needs_only_one_match_and_reports_the_rest():
    class Declares(BlockRegressor):
        _fsdp_wrap_modules: ClassVar[list[str]] = ["Block", "VisionLayer"]

    sel = select_units(Declares(), FSDPConfig())
    assert sel.paths == ("blocks.0", "blocks.1", "blocks.2") and sel.unmatched == ("VisionLayer",)


def test_default_wrap_modules_argument_replaces_the_attribute():
    sel = select_units(PlainRegressor(), FSDPConfig(), default_wrap_modules=["Head"])
    assert sel.paths == ("head",) and sel.source == "default_wrap_modules"
    sel = select_units(
        BlockRegressor(),
        FSDPConfig(),
        default_wrap_modules=["Head"],
        default_wrap_modules_source="MyConfig.units",
    )
    assert sel.paths == ("head",) and sel.source == "MyConfig.units"  # the attribute's Block is not read


def test_an_empty_default_list_is_the_callers_answer_and_the_refusal_names_its_source():
    """A caller that keeps the policy's units in its config passes them even when empty: the class
    attribute (BlockRegressor declares Block) is not consulted, and the refusal names the caller's field."""
    with pytest.raises(ShardingError) as err:
        select_units(
            BlockRegressor(),
            FSDPConfig(),
            default_wrap_modules=(),
            default_wrap_modules_source="MyConfig.units",
        )
    msg = str(err.value)
    assert "BlockRegressor gives none: MyConfig.units lists no block class" in msg, msg
    assert "or name the block classes in MyConfig.units." in msg and "_fsdp_wrap_modules" not in msg
    assert "accelerator.fsdp.wrap_modules=" in msg and "accelerator.fsdp.min_num_params=N" in msg
    plan = build_plan(
        BlockRegressor(), FSDP2, default_wrap_modules=["Block"], default_wrap_modules_source="MyConfig.units"
    )
    assert plan.unit_source == "MyConfig.units"
    with pytest.raises(ShardingError, match="MyConfig.units lists no block class"):
        build_plan(
            BlockRegressor(), FSDP2, default_wrap_modules=[], default_wrap_modules_source="MyConfig.units"
        )


class HeadNeverForwarded(BlockRegressor):
    _fsdp_no_forward_modules: ClassVar[tuple[str, ...]] = ("Head",)


def test_no_forward_classes_come_from_the_argument_else_from_the_class_attributes():
    by_name = FSDPConfig(wrap_modules=("Head",))
    with pytest.raises(ShardingError, match=r"Head never runs its forward\(\)"):  # the attribute, as fallback
        select_units(HeadNeverForwarded(), by_name)
    assert select_units(HeadNeverForwarded(), by_name, no_forward=()).paths == ("head",)  # given: replaces it
    with pytest.raises(ShardingError, match=r"Head never runs its forward\(\)"):
        select_units(BlockRegressor(), by_name, no_forward=["Head"])
    # the size rule passes over them: Head (82) would be a unit at 80, its parameters go to the root instead
    assert "head" in select_units(BlockRegressor(), FSDPConfig(min_num_params=80)).paths
    assert (
        "head" not in select_units(BlockRegressor(), FSDPConfig(min_num_params=80), no_forward=["Head"]).paths
    )
    # build_plan hands its argument down, sharded and unsharded (activation checkpointing's blocks)
    with pytest.raises(ShardingError, match=r"Head never runs its forward\(\)"):
        build_plan(
            BlockRegressor(), FSDP2, AcceleratorConfig(fsdp=by_name), default_no_forward_modules=["Head"]
        )
    assert (
        build_plan(
            HeadNeverForwarded(), FSDP2, AcceleratorConfig(fsdp=by_name), default_no_forward_modules=[]
        )
        .units[0]
        .path
        == "head"
    )
    checkpointed = AcceleratorConfig(
        fsdp=by_name, activation_checkpointing=ActivationCheckpointingConfig(mode="full")
    )
    with pytest.raises(ShardingError, match=r"Head never runs its forward\(\)"):
        build_plan(
            BlockRegressor(), ParallelRuntime.single(), checkpointed, default_no_forward_modules=["Head"]
        )


def test_no_source_fails_naming_the_three_ways():
    with pytest.raises(ShardingError) as err:
        select_units(PlainRegressor(), FSDPConfig())
    msg = str(err.value)
    assert (
        "accelerator.fsdp.wrap_modules=" in msg
        and "accelerator.fsdp.min_num_params=N" in msg
        and "--" not in msg
    )
    assert "_fsdp_wrap_modules" in msg and "PlainRegressor" in msg


def test_root_only_and_containers_are_refused():
    with pytest.raises(ShardingError, match="only the root module"):
        select_units(BlockRegressor(), FSDPConfig(wrap_modules=("BlockRegressor",)))
    with pytest.raises(ShardingError, match="container without forward"):
        select_units(BlockRegressor(), FSDPConfig(wrap_modules=("ModuleList",)))


def test_min_num_params_is_bottom_up_and_non_overlapping():
    model = BlockRegressor()  # inp 117, each fc1 322 / fc2 312 (Block 634), head 82 (norm 26 + proj 56)
    assert select_by_size(model, 300).paths == tuple(
        f"blocks.{i}.{fc}" for i in range(3) for fc in ("fc1", "fc2")
    )
    # 400: no Linear qualifies, each Block does (634); the ModuleList never; the root is not a unit
    assert select_by_size(model, 400).paths == ("blocks.0", "blocks.1", "blocks.2")
    # 80: the head's proj (56) and norm (26) are too small alone, the Head (82) takes both
    assert "head" in select_by_size(model, 80).paths and "head.proj" not in select_by_size(model, 80).paths
    with pytest.raises(ShardingError, match="no submodule"):
        select_by_size(model, 10**6)
    # ignored parameters do not count toward a unit
    skip = frozenset(id(p) for p in model.blocks[0].fc1.parameters())
    assert "blocks.0.fc1" not in select_by_size(model, 300, skip).paths


def test_children_first_order():
    assert children_first(["a", "a.b.c", "x", "a.b"]) == ["a.b.c", "a.b", "a", "x"]


def test_ignored_modules_match_whole_paths():
    model = BlockRegressor()
    pattern = FSDPConfig(ignored_modules="head").ignored_modules_pattern
    assert select_ignored(model, pattern) == ("head",)  # not head.norm / head.proj separately
    assert select_ignored(model, FSDPConfig(ignored_modules=r".*\.fc2").ignored_modules_pattern) == (
        "blocks.0.fc2",
        "blocks.1.fc2",
        "blocks.2.fc2",
    )
    with pytest.raises(ShardingError, match="matches no module path") as err:
        select_ignored(
            model, FSDPConfig(ignored_modules="fc2").ignored_modules_pattern
        )  # fullmatch, not search
    assert "blocks.0.fc2" in str(err.value)
    assert select_ignored(model, None) == ()


def test_tied_weights_across_unit_and_root_name_parameter_and_both_units():
    with pytest.raises(ShardingError) as err:
        check_tied_weights(TiedTokenModel(), ["blocks.0", "blocks.1", "head"])
    msg = str(err.value)
    assert "embed.weight" in msg and "head.proj.weight" in msg
    assert "unit head (TokenHead)" in msg and "root <root> (TiedTokenModel)" in msg


def test_tied_weights_across_two_units_are_refused():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
            self.b.weight = self.a.weight

    with pytest.raises(ShardingError, match=r"unit a \(Linear\) and by unit b \(Linear\)"):
        check_tied_weights(TwoHeads(), ["a", "b"])


def test_tied_weights_inside_one_unit_or_ignored_are_fine():
    model = TiedTokenModel()
    check = check_tied_weights(model, ["blocks.0", "blocks.1"])  # embed and head both in the root
    assert len(check.shared) == 1 and set(check.shared[0].names) == {"embed.weight", "head.proj.weight"}
    assert "embed.weight = head.proj.weight (in <root>)" in check.describe()
    assert check_tied_weights(model, ["head"], frozenset({id(model.embed.weight)})).shared == ()
    assert check_tied_weights(BlockRegressor(), ["blocks.0"]).describe() == "Tied weights: none"
