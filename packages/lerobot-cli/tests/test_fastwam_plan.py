"""FastWAM's sharding plan at full size, on the meta device, as ``lerobot-train`` makes it (the CLI's
flags, ``workload.sharding_plan``, fp32 masters under bf16): 30 ``MoTLayer`` units, each owning both experts'
block i, the root holding the experts' embeddings and heads and the proprio encoder; the bytes per rank on
8 GPUs for FSDP2 and HSDP 2x4, with and without ``freeze_video_expert``;
``--accelerator.fsdp.wrap_modules='["MoTLayer"]'`` and a size rule give the spec's plan, while the classes
whose ``forward`` never runs are refused; ``--policy.use_gradient_checkpointing`` checkpoints each
``MoTLayer`` (the same gradients, fewer saved bytes); and a model built on the meta device, materialised with
``to_empty`` and loaded, computes its RoPE tables afresh and the forward of a model built on the host.

The real launches (DDP, FSDP2, HSDP, the dry run's console output) are tests/test_fastwam_layouts.py.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.config import TrainConfig
from lerobot_cli.policies.fastwam import rope
from lerobot_cli.policies.fastwam.config import FastWAMConfig
from lerobot_cli.policies.fastwam.dit_configs import tiny_dit_configs
from lerobot_cli.policies.fastwam.model import FastWAMModel
from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy
from lerobot_cli.workload import effective_accelerator, fp32_masters, sharding_plan
from lerobot_parallel import ShardingError
from lerobot_parallel.plan import ShardingPlan
from lerobot_parallel.runtime import ParallelRuntime

# LeRobot 0.6.1's default FastWAM (tools/interop/fastwam_lerobot_interop.py counts LeRobot's own).
FULL_PARAMETERS, TRAINABLE_FROZEN_VIDEO = 6_020_710_599, 1_020_922_887
VIDEO_BLOCK, ACTION_BLOCK = 163_656_704, 33_600_512  # block i of each expert, at full size
LAYER = VIDEO_BLOCK + ACTION_BLOCK  # 197,257,216: one MoTLayer unit
ROOT = FULL_PARAMETERS - 30 * LAYER  # 102,994,119: both experts' embeddings and heads, the proprio encoder
FSDP8 = ("--parallelism.dp_shard=8",)
HSDP2X4 = ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=4")
BF16 = ("--accelerator.mixed_precision=bf16",)


def train_config(*flags: str, policy: FastWAMConfig) -> TrainConfig:
    """The run config the CLI parses from ``flags``, with ``policy`` as its policy."""
    return attrs.evolve(build_train_config(split_argv(list(flags)).flags).config, policy=policy)


def plan_of(policy: FastWAMPolicy, *flags: str) -> ShardingPlan:
    cfg = train_config(*flags, policy=policy.config)
    return sharding_plan(cfg, policy, ParallelRuntime.preview(cfg.parallelism))


def meta_policy(config: FastWAMConfig, mixed_precision: str = "bf16") -> FastWAMPolicy:
    """What the dry run plans: the policy on the meta device, trainable parameters upcast to fp32 masters
    under mixed precision (``workload.fp32_masters``, as every layout trains them)."""
    with torch.device("meta"):
        return fp32_masters(FastWAMPolicy(config), mixed_precision)


@pytest.fixture(scope="module")
def full() -> dict[bool, FastWAMPolicy]:
    """The full-size policy, bf16 weights with fp32 masters, with and without freeze_video_expert."""
    return {freeze: meta_policy(FastWAMConfig(freeze_video_expert=freeze)) for freeze in (False, True)}


# -- units -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", [FSDP8, HSDP2X4], ids=["fsdp8", "hsdp2x4"])
def test_thirty_mot_layer_units_own_both_experts_block_i_and_the_root_the_rest(full, topology):
    policy = full[False]
    plan = plan_of(policy, *topology, *BF16)
    assert plan.unit_source == "the fastwam policy's PolicySpec.wrap_units"
    assert [u.path for u in plan.units] == [f"model.mot.layers.{i}" for i in range(30)]
    assert {u.class_name for u in plan.units} == {"MoTLayer"} and not any(u.members for u in plan.units)
    for unit in plan.units:
        layer = policy.get_submodule(unit.path)
        assert list(layer.blocks) == ["video", "action"]
        assert sum(p.numel() for p in layer.blocks["video"].parameters()) == VIDEO_BLOCK
        assert sum(p.numel() for p in layer.blocks["action"].parameters()) == ACTION_BLOCK
        assert unit.num_params == LAYER == sum(p.numel() for p in layer.parameters())
    leftovers = [*policy.model.mot.mixtures.parameters(), *policy.model.proprio_encoder.parameters()]
    assert plan.root.class_name == "FastWAMPolicy"
    assert plan.root.num_params == ROOT == sum(p.numel() for p in leftovers)
    assert 30 * LAYER + ROOT == sum(p.numel() for p in policy.parameters()) == FULL_PARAMETERS
    text = "\n".join(plan.describe())
    assert "Wrap units from the fastwam policy's PolicySpec.wrap_units: 30 unit(s) + the root" in text
    assert "MoTLayer x30 (197,257,216 params each), first model.mot.layers.0" in text
    assert "<root> (FastWAMPolicy): 102,994,119 params" in text
    assert "parameters all-gathered in bfloat16" in text and "fp32 master weights" in text
    assert "Tied weights: none" in text


# -- bytes per rank ----------------------------------------------------------------------------------

# (params, grads, optimizer) bytes per rank: fp32 masters for the trainable parameters (4 + 4 + 2 x 4 bytes
# each), bf16 for the frozen video expert (2 bytes, no gradient or state), dim 0 padded to the shard count.
BYTES = {
    (False, "fsdp8"): (3_012_957_796, 3_012_957_796, 6_025_915_592),
    (False, "hsdp2x4"): (6_022_941_896, 6_022_941_896, 12_045_883_792),
    (False, "ddp8"): (24_082_842_396, 24_082_842_396, 48_165_684_792),
    (True, "fsdp8"): (1_762_032_436, 511_107_076, 1_022_214_152),
    (True, "hsdp2x4"): (3_522_209_384, 1_021_476_872, 2_042_953_744),
    (True, "ddp8"): (14_083_266_972, 4_083_691_548, 8_167_383_096),
}
TOPOLOGIES = {"fsdp8": (FSDP8, 8), "hsdp2x4": (HSDP2X4, 4), "ddp8": (("--parallelism.dp_replicate=8",), 1)}


@pytest.mark.parametrize("freeze", [False, True], ids=["all_trainable", "freeze_video_expert"])
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_bytes_per_rank_on_eight_gpus(full, freeze, topology):
    flags, shards = TOPOLOGIES[topology]
    memory = plan_of(full[freeze], *flags, *BF16).memory
    assert (memory.params, memory.grads, memory.optimizer) == BYTES[freeze, topology]
    # The same from the counts alone: 16 bytes per trainable parameter (fp32 master, gradient, AdamW's two
    # states), 2 per frozen one (bf16, nothing else), over the shards; FSDP2 pads dim 0 to a multiple of the
    # shards (each rank holds a whole (1, 6, D) modulation, one row; the (7, 1024) action head: under 0.2 %).
    trainable = TRAINABLE_FROZEN_VIDEO if freeze else FULL_PARAMETERS
    unsharded = 16 * trainable + 2 * (FULL_PARAMETERS - trainable)
    assert memory.unsharded_total == unsharded
    assert unsharded / shards <= memory.total <= 1.002 * unsharded / shards
    assert memory.optimizer == 2 * memory.grads


def test_the_frozen_video_expert_keeps_bf16_and_takes_no_gradient_bytes(full):
    policy = full[True]
    dtypes = {name: (p.dtype, p.requires_grad) for name, p in policy.named_parameters()}
    assert dtypes["model.mot.layers.3.blocks.video.ffn.0.weight"] == (torch.bfloat16, False)
    assert dtypes["model.mot.mixtures.video.patch_embedding.weight"] == (torch.bfloat16, False)
    assert dtypes["model.mot.layers.3.blocks.action.ffn.0.weight"] == (torch.float32, True)
    assert dtypes["model.proprio_encoder.weight"] == (torch.float32, True)
    # a MoTLayer holds fp32 trainable and bf16 frozen parameters: FSDP2 all-gathers both in bf16 and needs
    # one dtype among the trainable ones only, so the plan accepts it
    assert len(plan_of(policy, *FSDP8, *BF16).units) == 30


# -- the flags that replace the spec's units ---------------------------------------------------------


def test_wrap_modules_flag_and_a_size_rule_give_the_specs_plan(full):
    policy = full[False]
    spec = plan_of(policy, *FSDP8, *BF16)
    for flag, source in (
        ('--accelerator.fsdp.wrap_modules=["MoTLayer"]', "accelerator.fsdp.wrap_modules"),
        # bigger than any video block (163.7 M), smaller than a layer (197.3 M)
        ("--accelerator.fsdp.min_num_params=170000000", "accelerator.fsdp.min_num_params=170000000"),
        # smaller than a video block: a block's forward never runs, so its parameters count to its layer
        ("--accelerator.fsdp.min_num_params=100000000", "accelerator.fsdp.min_num_params=100000000"),
    ):
        got = plan_of(policy, *FSDP8, *BF16, flag)
        assert got.unit_source == source
        assert got.units == spec.units and got.root == spec.root, flag
        assert got.memory == spec.memory and got.precision == spec.precision, flag


@pytest.mark.parametrize(
    "name", ["DiTBlock", "Projections", "VideoHead", "MoT", "VideoDiT", "ActionDiT", "FastWAMModel"]
)
def test_a_class_whose_forward_never_runs_is_refused_as_a_unit(full, name):
    """FSDP gathers a unit in a hook on its forward: these are only ever called through their parts or
    other methods (a block's open/close inside MoTLayer.forward, the head's project, the experts' embed), so
    as units their shards would never be gathered and the first step would fail on every rank."""
    with pytest.raises(ShardingError, match=f"{name} never runs its forward"):
        plan_of(full[False], *FSDP8, f'--accelerator.fsdp.wrap_modules=["{name}"]')


# -- activation checkpointing ------------------------------------------------------------------------


@pytest.mark.parametrize("topology", [FSDP8, ()], ids=["fsdp8", "single"])
def test_use_gradient_checkpointing_checkpoints_each_mot_layer(topology):
    policy = meta_policy(FastWAMConfig(use_gradient_checkpointing=True))
    cfg = train_config(*topology, *BF16, policy=policy.config)
    assert effective_accelerator(cfg).activation_checkpointing.mode == "full"
    plan = sharding_plan(cfg, policy, ParallelRuntime.preview(cfg.parallelism))
    assert plan.activation_checkpointing == "full"
    assert plan.block_paths == tuple(f"model.mot.layers.{i}" for i in range(30))
    assert "Activation checkpointing: full, on 30 block(s) (MoTLayer x30)" in plan.describe()
    # the CLI's own flag without the policy's field plans the same blocks
    off = attrs.evolve(policy.config, use_gradient_checkpointing=False)
    flagged = train_config(*topology, *BF16, "--accelerator.activation_checkpointing.mode=full", policy=off)
    assert sharding_plan(flagged, policy, ParallelRuntime.preview(flagged.parallelism)).blocks == plan.blocks
    unflagged = train_config(*topology, *BF16, policy=off)
    assert sharding_plan(unflagged, policy, ParallelRuntime.preview(unflagged.parallelism)).blocks == ()


def tiny(layers: int = 4, **overrides) -> FastWAMConfig:
    video, action = tiny_dit_configs(num_layers=layers)
    return FastWAMConfig(
        video_dit_config=video,
        action_dit_config=action,
        torch_dtype="float32",
        action_horizon=8,
        n_action_steps=8,
        **overrides,
    )


def joint_inputs(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "latents": torch.randn(2, 48, 3, 4, 6, generator=g),
        "timestep_video": torch.tensor([400.0, 600.0]),
        "actions": torch.randn(2, 8, 7, generator=g),
        "timestep_action": torch.tensor([300.0, 900.0]),
        "context": torch.randn(2, 5, 32, generator=g),
        "context_mask": torch.tensor([[True] * 5, [True, True, True, False, False]]),
    }


def joint(model: FastWAMModel, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The joint pass the training loss runs (video and action velocities), without the frozen encoders."""
    keys = ("latents", "timestep_video", "actions", "timestep_action", "context", "context_mask")
    return model.predict(*(x[k] for k in keys))


@pytest.mark.parametrize(
    ("mode", "mixed_attention"),
    [("full", False), ("selective", False), ("full", True)],
    ids=["full", "selective", "full_with_mot_checkpoint_mixed_attn"],
)
def test_checkpointed_mot_layers_give_the_same_gradients_and_save_fewer_bytes(mode, mixed_attention):
    """A 4-layer tiny FastWAM core (the networks; the frozen VAE and UMT5 only make its inputs) through the
    plan with each MoTLayer checkpointed: its joint pass and a squared loss give bitwise the same gradients
    (the same ops recomputed) while autograd keeps under half the bytes. LeRobot's
    mot_checkpoint_mixed_attn (the attention alone) nests inside."""
    from lerobot_parallel.regions import Region
    from lerobot_parallel.testing import saved_tensor_bytes
    from lerobot_parallel.wrap import wrap_model

    runtime = ParallelRuntime.preview(train_config(policy=tiny()).parallelism)
    grads, saved = [], []
    for checkpointing in ("none", mode):
        torch.manual_seed(0)
        config = tiny(mot_checkpoint_mixed_attn=mixed_attention)
        model = FastWAMModel(config).train()
        flags = () if checkpointing == "none" else (f"--accelerator.activation_checkpointing.mode={mode}",)
        plan = sharding_plan(train_config(*flags, policy=config), model, runtime)
        wrap_model(model, runtime, plan)
        regions = [isinstance(layer.__dict__.get("forward"), Region) for layer in model.mot.layers]
        assert regions == [checkpointing != "none"] * 4

        def step(model=model):
            video, action = joint(model, joint_inputs())
            return video.square().mean() + action.square().mean()

        loss, nbytes = saved_tensor_bytes(step)
        loss.backward()
        saved.append(nbytes)
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    # every parameter of the mixture (the proprio encoder makes a context token, outside the joint pass)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == len(list(model.mot.parameters()))
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=0, atol=0, msg=name)
    assert saved[1] < 0.5 * saved[0], saved


# -- meta device, then real memory -------------------------------------------------------------------


def test_full_size_policy_holds_no_buffer_and_no_rope_table_on_meta(full):
    """Nothing but parameters lives in the module tree (RoPE tables are host state built at first use), so a
    meta-built model that ``to_empty`` materialises has no uninitialised table to carry."""
    for policy in full.values():
        assert dict(policy.named_buffers()) == {}
        for expert in (policy.model.video_expert, policy.model.action_expert):
            assert expert.rope._host is None and expert.rope._on == {}


def test_meta_built_model_materialised_with_to_empty_computes_its_rope_afresh():
    """Full head geometry (128 channels per head: the full model's rotary tables) at a small width: the
    networks built on the meta device and planned, then ``to_empty`` on the host and loaded with a host-built
    copy's weights: their tables are Wan's and the joint pass equals the host-built copy's bit for bit."""
    video, action = tiny_dit_configs(num_layers=2)
    video.update(num_heads=2, attn_head_dim=128, hidden_dim=256)
    action.update(num_heads=2, attn_head_dim=128)
    config = FastWAMConfig(
        video_dit_config=video,
        action_dit_config=action,
        torch_dtype="float32",
        action_horizon=8,
        n_action_steps=8,
    )
    torch.manual_seed(0)
    host = FastWAMModel(config).eval()
    with torch.no_grad():
        for p in host.parameters():  # no zero head: every output depends on every table entry it reads
            p.add_(0.05 * torch.randn_like(p))
    with torch.device("meta"):
        lazy = FastWAMModel(config)
    assert [u.path for u in plan_of_model(lazy, config).units] == ["mot.layers.0", "mot.layers.1"]
    lazy.to_empty(device="cpu")
    lazy.load_state_dict(host.state_dict(), strict=True)
    lazy.eval()
    with torch.no_grad():
        got, want = joint(lazy, joint_inputs()), joint(host, joint_inputs())
    assert torch.equal(lazy.video_expert.rope.host(), rope.video_rotary_table(128))
    assert torch.equal(lazy.action_expert.rope.host(), rope.rotary_angles(128))
    assert lazy.video_expert.rope.host().shape == (1024, 64)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert float(got[0].abs().sum()) > 0 and float(got[1].abs().sum()) > 0


def plan_of_model(model: torch.nn.Module, config: FastWAMConfig) -> ShardingPlan:
    cfg = train_config("--parallelism.dp_shard=2", policy=config)
    return sharding_plan(cfg, model, ParallelRuntime.preview(cfg.parallelism))
