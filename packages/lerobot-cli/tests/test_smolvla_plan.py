"""SmolVLA's sharding plan at full size, on the meta device, as ``lerobot-train`` makes it (the CLI's flags,
``workload.sharding_plan``, which passes the spec's ``unit_groups``): the vision encoder's layers are units,
and VLM text layer i with the expert layer paired with it is one unit, because the layer loop runs both in
one call (``SmolVLMLayer.joint``: a joint attention, or the expert's cross-attention to that VLM layer's
keys and values); the token embedding is a unit, and so is the ``lm_head`` nothing reads (never gathered);
everything else is the root's. ``--dry_run`` prints that plan in seconds. The real
launches (DDP, FSDP2) are tests/test_smolvla_layouts.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import attrs
import pytest
import torch
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.smolvla.config import SmolVLAConfig
from lerobot_cli.policies.smolvla.modeling import SmolVLAPolicy
from lerobot_cli.workload import sharding_plan
from lerobot_parallel.memory import format_bytes
from lerobot_parallel.runtime import ParallelRuntime

HERE = Path(__file__).resolve().parent
DEMO = HERE.parents[2] / "data" / "lerobot" / "demo_reach"
FULL_CONFIG = HERE / "data" / "smolvlm2_500m_video_instruct_config.json"
TOWERS = "model.vlm_with_expert."
VLM = TOWERS + "vlm.model.text_model.layers"
EXPERT = TOWERS + "lm_expert.layers"
VISION = TOWERS + "vlm.model.vision_model.encoder.layers"
LAYERS, VISION_LAYERS = 16, 12  # num_vlm_layers (the default) and SmolVLM2-500M's vision depth
EMBED, HEAD = TOWERS + "vlm.model.text_model.embed_tokens", TOWERS + "vlm.lm_head"
FEATURES = {
    "input_features": {
        "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 512, 512)),
        "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
    },
    "output_features": {"action": PolicyFeature(FeatureType.ACTION, (6,))},
}


@pytest.fixture(scope="module")
def full_vlm(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("smolvlm2_500m")
    config = json.loads(FULL_CONFIG.read_text())
    config.pop("_source")
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def full_policy(vlm: Path, **overrides) -> SmolVLAPolicy:
    with torch.device("meta"):
        return SmolVLAPolicy(SmolVLAConfig(**FEATURES, vlm_model_name=str(vlm), **overrides))


def plan_of(policy: SmolVLAPolicy, *flags: str):
    cfg = attrs.evolve(build_train_config(split_argv(list(flags)).flags).config, policy=policy.config)
    return sharding_plan(cfg, policy, ParallelRuntime.preview(cfg.parallelism))


def assert_covers_every_parameter_once(policy: SmolVLAPolicy, plan) -> None:
    """Each parameter lies in at most one unit member (units do not nest here), and the units' and the
    root's counts add up to the model's."""
    unit_of: dict[str, str] = {}
    for unit in plan.units:
        for path in unit.paths:
            for name, _ in policy.get_submodule(path).named_parameters():
                full = f"{path}.{name}"
                assert full not in unit_of, (full, unit_of.get(full), unit.label)
                unit_of[full] = unit.label
    for unit in plan.units:
        members = [policy.get_submodule(path) for path in unit.paths]
        assert unit.num_params == sum(p.numel() for m in members for p in m.parameters()), unit.label
    root = sum(p.numel() for n, p in policy.named_parameters() if n not in unit_of)
    assert plan.root.num_params == root
    total = sum(p.numel() for p in policy.parameters())
    assert sum(u.num_params for u in plan.units) + plan.root.num_params == total


@pytest.mark.parametrize(
    "topology",
    [("--parallelism.dp_shard=8",), ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=4")],
    ids=["fsdp8", "hsdp2x4"],
)
def test_each_vlm_layer_and_its_expert_layer_are_one_unit(full_vlm, topology):
    policy = full_policy(full_vlm)
    plan = plan_of(policy, *topology, "--accelerator.mixed_precision=bf16")
    assert plan.unit_source == "the smolvla policy's PolicySpec.wrap_units"
    assert len(plan.units) == LAYERS + VISION_LAYERS + 2
    joint = [u for u in plan.units if u.members]
    assert [u.paths for u in joint] == [(f"{VLM}.{i}", f"{EXPERT}.{i}") for i in range(LAYERS)]
    assert {u.class_name for u in joint} == {"SmolVLMLayer+SmolExpertLayer"}
    alone = {u.path: u.class_name for u in plan.units if not u.members}
    vision = {f"{VISION}.{i}": "SmolVLMEncoderLayer" for i in range(VISION_LAYERS)}
    assert alone == {**vision, EMBED: "SmolVLMTokenEmbedding", HEAD: "UnusedLMHead"}
    # what stays in the root, gathered all step long: the vision embeddings, the connector, the norms and
    # the flow projections (the embedding and lm_head would add 94.6 M)
    assert plan.root.num_params == 14_811_872  # 14.8 M of 450 M
    assert_covers_every_parameter_once(policy, plan)
    text = "\n".join(plan.describe())
    assert (
        f"SmolVLMLayer+SmolExpertLayer x{LAYERS}" in text and f"SmolVLMEncoderLayer x{VISION_LAYERS}" in text
    )


def test_a_shallower_expert_leaves_the_unpaired_vlm_layers_units_of_their_own(full_vlm):
    """num_expert_layers=8 of 16 (self-attention: LeRobot pairs VLM layer 2j with expert layer j): the
    odd VLM layers run without an expert layer, each a SmolVLMSoloLayer unit."""
    policy = full_policy(full_vlm, num_expert_layers=8, attention_mode="self_attn")
    plan = plan_of(policy, "--parallelism.dp_shard=4", "--accelerator.mixed_precision=bf16")
    joint = [u.paths for u in plan.units if u.members]
    assert joint == [(f"{VLM}.{2 * j}", f"{EXPERT}.{j}") for j in range(8)]
    solo = [u.path for u in plan.units if u.class_name == "SmolVLMSoloLayer"]
    assert solo == [f"{VLM}.{2 * j + 1}" for j in range(8)]
    assert len(plan.units) == 8 + 8 + VISION_LAYERS + 2
    assert_covers_every_parameter_once(policy, plan)


def test_dry_run_plans_the_full_size_in_seconds(full_vlm, monkeypatch, capsys):
    from lerobot_cli.train import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--policy.type=smolvla",
        f"--policy.vlm_model_name={full_vlm}",
        "--dry_run=true",
        "--parallelism.dp_shard=8",
        "--accelerator.mixed_precision=bf16",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # LeRobot's counts (test_policy_smolvla.py), and the plan: 30 units, per-rank bytes at 1/8
    assert "Policy: smolvla; parameters 450,046,176 (learnable 99,880,992)" in out
    units = LAYERS + VISION_LAYERS + 2
    assert f"Wrap units from the smolvla policy's PolicySpec.wrap_units: {units} unit(s)" in out
    assert f"SmolVLMLayer+SmolExpertLayer x{LAYERS}" in out and f"SmolVLMEncoderLayer x{VISION_LAYERS}" in out
    assert "(0.125x of the unsharded" in out
    # what a rank holds of the frozen VLM and vision tower, apart from the trained expert's bytes
    assert "params per rank: trainable " in out and "no grads, no optimizer state)" in out, out[-2000:]
    # and which parts: LeRobot's train_expert_only freezes the whole VLM (350 M of the 450 M)
    assert (
        "Frozen: 350,165,184 params, held (sharded with their units when sharded) with no grads and no "
        f"optimizer state: {TOWERS}vlm (350,165,184 params)"
    ) in out, out[-2000:]


def test_training_the_vlm_leaves_the_vision_tower_and_the_unread_parts_frozen(full_vlm):
    """train_expert_only=false: LeRobot still freezes the vision tower and what nothing reads (the lm_head,
    the text norm, the last VLM layer); the dry run names them, the last layer by its own index."""
    from lerobot_cli.frozen_parts import describe_frozen, frozen_parts

    policy = full_policy(full_vlm, train_expert_only=False)
    parts = frozen_parts(policy)
    assert [path for path, _ in parts] == [
        TOWERS + "vlm.model.vision_model",
        f"{VLM}.{LAYERS - 1}",
        TOWERS + "vlm.model.text_model.norm",
        HEAD,
    ]
    frozen = sum(p.numel() for p in policy.parameters() if not p.requires_grad)
    assert sum(n for _, n in parts) == frozen == 143_575_104
    line = describe_frozen(policy)
    assert f"{VLM}.{LAYERS - 1} (9,832,320 params)" in line and f"{HEAD} (47,308,800 params)" in line, line
    # numbered siblings frozen alike are one entry (here layers 0-2 beside the last one)
    for layer in policy.model.vlm_with_expert.vlm.model.text_model.layers[:3]:
        layer.requires_grad_(False)
    assert f"{VLM}.* x4 ({4 * 9_832_320:,} params)" in describe_frozen(policy)


@pytest.mark.parametrize("train_expert_only", [True, False])
def test_the_plan_tells_the_frozen_towers_bytes_from_the_trained_ones(full_vlm, train_expert_only):
    """LeRobot's defaults freeze the whole VLM (``train_expert_only``: its text layers, embedding and vision
    tower) and train the expert; training the VLM still freezes the vision tower (and the parts nothing
    reads). Those frozen parts are
    sharded with their units (1/4 of them per rank, padded) but have no gradient and no optimizer state: the
    plan's estimate counts them apart, to the byte, and the banner's line says so."""
    from lerobot_parallel.memory import padded_shard_numel

    policy = full_policy(full_vlm, train_expert_only=train_expert_only)
    plan = plan_of(policy, "--parallelism.dp_shard=4", "--accelerator.mixed_precision=bf16")
    named = dict(policy.named_parameters())
    frozen = [n for n, p in named.items() if not p.requires_grad]
    assert any(n.startswith(VISION) for n in frozen) and all(n.startswith(TOWERS + "vlm.") for n in frozen)
    frozen_layers = {int(n[len(VLM) + 1 :].split(".")[0]) for n in frozen if n.startswith(VLM + ".")}
    # training the VLM, LeRobot still freezes its last layer (nothing reads its output; unread_modules)
    assert frozen_layers == (set(range(LAYERS)) if train_expert_only else {LAYERS - 1})
    assert not any(n.startswith(EXPERT) for n in frozen)

    def shard_bytes(names: list[str], itemsize=None) -> int:
        return sum(
            padded_shard_numel(named[n].shape, 4) * (itemsize or named[n].dtype.itemsize) for n in names
        )

    m = plan.memory
    trained = [n for n in named if n not in frozen]
    # frozen parameters kept in their dtype (the config's bf16 towers), the trained ones as fp32 masters
    assert m.frozen_params == shard_bytes(frozen) > 0
    assert m.params - m.frozen_params == m.grads == shard_bytes(trained, itemsize=4)
    assert m.optimizer == 2 * m.grads
    assert m.frozen_params * 4 >= m.unsharded_frozen_params > m.frozen_params * 4 * 0.99
    line = "\n".join(plan.describe())
    assert f"frozen {format_bytes(m.frozen_params)} (0.25" in line, line
    assert f"trainable {format_bytes(m.grads)} (with the grads and optimizer state above)" in line


def test_a_tied_lm_head_stays_in_the_root_with_the_embedding(tmp_path):
    """tie_word_embeddings: the lm_head is the embedding's weight; two units would split one tensor (the
    plan refuses that), so neither becomes a unit."""
    spec = importlib.util.spec_from_file_location("smolvlm_tiny", HERE / "smolvlm_tiny.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    vlm = builder.save_tiny_smolvlm(tmp_path / "tied")
    config = json.loads((vlm / "config.json").read_text())
    config["tie_word_embeddings"] = config["text_config"]["tie_word_embeddings"] = True
    (vlm / "config.json").write_text(json.dumps(config))
    tiny = {"num_vlm_layers": 4, "chunk_size": 4, "n_action_steps": 4, "resize_imgs_with_padding": (32, 32)}
    policy = full_policy(vlm, **tiny)
    towers = policy.model.vlm_with_expert
    assert towers.vlm.lm_head.weight is towers.vlm.model.text_model.embed_tokens.weight
    plan = plan_of(policy, "--parallelism.dp_shard=2")
    classes = {u.class_name for u in plan.units}
    assert classes == {"SmolVLMEncoderLayer", "SmolVLMLayer+SmolExpertLayer"}
    assert [s.owner for s in plan.tied.shared] == [""]  # the root holds both users
    assert_covers_every_parameter_once(policy, plan)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_of_the_blocks_gives_the_same_gradients(tmp_path, mode):
    """The plan's blocks (the units: SmolVLMLayer.joint among them) checkpointed: bit-equal loss and
    gradients. Selective checkpointing keeps matmul outputs, so a block must not change one in place
    (LeRobot's ``h += residual``, ``weights *= scale``): that corrupted the recomputed gradients."""
    from lerobot_parallel.config import CompileConfig
    from lerobot_parallel.regions import apply_regions

    spec = importlib.util.spec_from_file_location("smolvlm_tiny", HERE / "smolvlm_tiny.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    vlm = builder.save_tiny_smolvlm(tmp_path / "tiny")
    tiny = {"num_vlm_layers": 4, "chunk_size": 4, "n_action_steps": 4, "resize_imgs_with_padding": (32, 32)}
    config = SmolVLAConfig(
        **{**FEATURES, "vlm_model_name": str(vlm), **tiny, "train_expert_only": False},
        freeze_vision_encoder=False,
    )
    g = torch.Generator().manual_seed(0)
    batch = {
        "observation.images.top": torch.rand(2, 3, 32, 32, generator=g),
        "observation.state": torch.randn(2, 6, generator=g),
        "action": torch.randn(2, 4, 6, generator=g),
        "observation.language.tokens": torch.randint(0, 260, (2, 5), generator=g),
        "observation.language.attention_mask": torch.ones(2, 5, dtype=torch.bool),
    }
    noise, time = torch.randn(2, 4, 32, generator=g), torch.rand(2, generator=g)
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        policy = SmolVLAPolicy(config).train()
        if checkpointed:
            plan = plan_of(policy, f"--accelerator.activation_checkpointing.mode={mode}")
            assert {b.class_name for b in plan.blocks} >= {"SmolVLMLayer+SmolExpertLayer"}
            apply_regions(policy, plan.block_paths, checkpointing=mode, compile_config=CompileConfig())
        loss, _ = policy(batch, noise=noise, time=time)
        loss.backward()
        grads.append(
            {"loss": loss.detach(), **{n: p.grad for n, p in policy.named_parameters() if p.grad is not None}}
        )
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 50
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0]), [
        k for k in grads[0] if not torch.equal(grads[0][k], grads[1][k])
    ]
