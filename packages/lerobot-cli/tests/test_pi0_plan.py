"""pi0's sharding plan at full size, on the meta device, as ``lerobot-train`` makes it (the CLI's flags,
``workload.sharding_plan``, which passes the spec's ``unit_groups``): each joint layer pair (PaliGemma
layer i, action expert layer i) is one FSDP unit, because the two run together in one joint attention
(``PaliGemmaWithExpert``); sharded apart, one ``fully_shard`` call would gather half of what a layer
computes with. The real launches (DDP, FSDP2, HSDP) are tests/test_pi0_layouts.py; the same plan for
FastWAM: test_fastwam_plan.py."""

from __future__ import annotations

import attrs
import pytest
import torch
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.pi0.config import PI0Config
from lerobot_cli.policies.pi0.modeling import PI0Policy
from lerobot_cli.workload import sharding_plan
from lerobot_parallel.runtime import ParallelRuntime

VLM = "model.paligemma_with_expert.paligemma.model.language_model.layers"
EXPERT = "model.paligemma_with_expert.gemma_expert.model.layers"
LAYERS = 18  # gemma_2b and gemma_300m, the defaults
FEATURES = {
    "input_features": {
        "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 224, 224)),
        "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
    },
    "output_features": {"action": PolicyFeature(FeatureType.ACTION, (6,))},
}


@pytest.fixture(scope="module")
def full() -> PI0Policy:
    with torch.device("meta"):
        return PI0Policy(PI0Config(**FEATURES))


@pytest.mark.parametrize(
    "topology",
    [("--parallelism.dp_shard=8",), ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=4")],
    ids=["fsdp8", "hsdp2x4"],
)
def test_each_joint_layer_pair_is_one_unit(full, topology):
    flags = [*topology, "--accelerator.mixed_precision=bf16"]
    cfg = attrs.evolve(build_train_config(split_argv(flags).flags).config, policy=full.config)
    plan = sharding_plan(cfg, full, ParallelRuntime.preview(cfg.parallelism))
    assert plan.unit_source == "the pi0 policy's PolicySpec.wrap_units"
    joint = [u for u in plan.units if u.members]
    assert [u.paths for u in joint] == [(f"{VLM}.{i}", f"{EXPERT}.{i}") for i in range(LAYERS)]
    assert {u.class_name for u in joint} == {"PaliGemmaLayer+ExpertLayer"}
    for unit in joint:
        pair = [full.get_submodule(path) for path in unit.paths]
        assert unit.num_params == sum(p.numel() for m in pair for p in m.parameters())
    # neither half of a pair is a unit of its own, and nothing else is grouped
    alone = {u.class_name for u in plan.units if not u.members}
    assert alone == {"SiglipEncoderLayer", "GemmaTextScaledWordEmbedding", "UnusedHead"}
    text = "\n".join(plan.describe())
    assert (
        f"PaliGemmaLayer+ExpertLayer x{LAYERS}" in text
        and "grouped units (PaliGemmaLayer+ExpertLayer" in text
    )
