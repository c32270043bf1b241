"""FastWAM's networks: LeRobot 0.6.1's state dict at full size (on the meta device, in seconds), one owner per
parameter (30 MoTLayers, nothing shared), the legacy block layout, the three MoT paths and what the masks
let through, RoPE after meta-device materialisation, the fp32 regions under bf16, freezing and LoRA targets.

Bit-equality with LeRobot's own modules is tools/interop/fastwam_lerobot_interop.py (LeRobot's environment);
the figures pinned here are the ones it measured on LeRobot's FastWAMPolicy.
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from lerobot_cli.policies.fastwam import attention, rope
from lerobot_cli.policies.fastwam.config import FastWAMConfig
from lerobot_cli.policies.fastwam.dit_configs import tiny_dit_configs
from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy
from lerobot_cli.policies.fastwam.mot import MoTLayer

# LeRobot 0.6.1's FastWAMPolicy at its defaults (tools/interop/fastwam_lerobot_interop.py measures both).
FULL_KEYS, FULL_PARAMETERS, FULL_TRAINABLE_FROZEN_VIDEO = 1651, 6_020_710_599, 1_020_922_887
FULL_SHAPES = {  # a sample of LeRobot's names and shapes, one per kind of module
    "model.mot.mixtures.video.patch_embedding.weight": (3072, 48, 1, 2, 2),
    "model.mot.mixtures.video.time_projection.1.weight": (18432, 3072),
    "model.mot.mixtures.video.head.modulation": (1, 2, 3072),
    "model.mot.mixtures.video.head.head.weight": (192, 3072),
    "model.mot.mixtures.action.action_encoder.weight": (1024, 7),
    "model.mot.mixtures.action.head.weight": (7, 1024),
    "model.mot.layers.29.blocks.video.modulation": (1, 6, 3072),
    "model.mot.layers.29.blocks.video.ffn.0.weight": (14336, 3072),
    "model.mot.layers.0.blocks.action.self_attn.q.weight": (3072, 1024),
    "model.mot.layers.0.blocks.action.self_attn.o.weight": (1024, 3072),
    "model.mot.layers.0.blocks.action.cross_attn.norm_k.weight": (3072,),
    "model.mot.layers.0.blocks.action.norm3.bias": (1024,),
    "model.proprio_encoder.weight": (4096, 8),
}
B, HORIZON = 2, 8


def tiny(**overrides) -> FastWAMConfig:
    video, action = tiny_dit_configs()
    video.update(overrides.pop("video", {}))
    # variant=tiny without a text encoder: the policy builds only a tiny VAE beside the networks tested here
    settings = {
        "torch_dtype": "float32",
        "action_horizon": HORIZON,
        "n_action_steps": HORIZON,
        "variant": "tiny",
        "load_text_encoder": False,
        **overrides,
    }
    return FastWAMConfig(video_dit_config=video, action_dit_config=action, **settings)


def tiny_policy(seed: int = 0, **overrides) -> FastWAMPolicy:
    """A seeded tiny policy whose parameters built constant (norm scales, zero biases, Wan's zero video head)
    are made random, so no output or comparison rests on a zero."""
    torch.manual_seed(seed)
    policy = FastWAMPolicy(tiny(**overrides))
    with torch.no_grad():
        for p in policy.parameters():
            if bool((p == p.flatten()[0]).all()):
                p.add_(0.1 * torch.randn_like(p))
    return policy


def inputs(seed: int = 1, frames: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "latents": torch.randn(B, 48, frames, 4, 6, generator=g),
        "actions": torch.randn(B, HORIZON, 7, generator=g),
        "context": torch.randn(B, 5, 32, generator=g),
        "context_mask": torch.tensor([[True] * 5, [True, True, True, False, False]]),
        "timestep_video": torch.tensor([400.0, 600.0]),
        "timestep_action": torch.tensor([300.0, 900.0]),
    }


def joint(policy: FastWAMPolicy, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return policy.model.predict(
        x["latents"], x["timestep_video"], x["actions"], x["timestep_action"], x["context"], x["context_mask"]
    )


def cached(policy: FastWAMPolicy, x: dict[str, torch.Tensor]) -> torch.Tensor:
    cache = policy.model.prefill(x["latents"][:, :, :1], x["context"], x["context_mask"], HORIZON)
    return policy.model.predict_action(
        cache, x["actions"], x["timestep_action"], x["context"], x["context_mask"]
    )


@pytest.fixture(scope="module")
def full() -> dict[bool, FastWAMPolicy]:
    """LeRobot's default FastWAM (~6 B parameters) on the meta device, with and without
    freeze_video_expert."""
    built = {}
    for freeze in (False, True):
        with torch.device("meta"):
            built[freeze] = FastWAMPolicy(FastWAMConfig(freeze_video_expert=freeze))
    return built


# -- full size --------------------------------------------------------------------------------------


def test_full_size_builds_on_meta_in_seconds_with_lerobots_state_dict():
    start = time.perf_counter()
    with torch.device("meta"):
        policy = FastWAMPolicy(FastWAMConfig())
    assert time.perf_counter() - start < 30
    state = policy.state_dict()
    assert len(state) == FULL_KEYS
    assert sum(p.numel() for p in policy.parameters()) == FULL_PARAMETERS
    assert {k: tuple(state[k].shape) for k in FULL_SHAPES} == FULL_SHAPES
    assert {v.dtype for v in state.values()} == {torch.bfloat16}  # every key bf16, as LeRobot's
    assert not any(
        k.startswith(("model.vae", "model.text_encoder", "model.video_expert", "model.dit")) for k in state
    )


def test_full_size_trainable_counts_with_and_without_freeze_video_expert(full):
    free, frozen = full[False], full[True]
    assert sum(p.numel() for p in free.parameters() if p.requires_grad) == FULL_PARAMETERS
    assert sum(p.numel() for p in free.get_optim_params()) == FULL_PARAMETERS
    assert sum(p.numel() for p in frozen.parameters() if p.requires_grad) == FULL_TRAINABLE_FROZEN_VIDEO
    assert sum(p.numel() for p in frozen.get_optim_params()) == FULL_TRAINABLE_FROZEN_VIDEO
    assert len(frozen.get_optim_params()) == 826


def test_thirty_mot_layers_each_parameter_with_one_owner(full):
    policy = full[False]
    layers = [m for m in policy.modules() if isinstance(m, MoTLayer)]
    assert len(layers) == 30 and list(layers[0].blocks) == ["video", "action"]
    everything = list(policy.named_parameters(remove_duplicate=False))
    assert len({id(p) for _, p in everything}) == len(everything)  # nothing reachable under two names
    owners: dict[int, int] = {}
    for index, layer in enumerate(layers):
        for p in layer.parameters():
            assert id(p) not in owners
            owners[id(p)] = index
    outside = [name for name, p in everything if id(p) not in owners]
    assert all(not re.search(r"\.layers\.|\.blocks\.", name) for name in outside)
    assert all(name.startswith(("model.mot.mixtures.", "model.proprio_encoder.")) for name in outside)
    assert len(owners) + len(outside) == len(everything)
    spec = FastWAMConfig.spec
    assert spec.wrap_units == ("MoTLayer",) and FastWAMPolicy._fsdp_wrap_modules == ["MoTLayer"]
    classes = {type(m).__name__ for m in policy.modules()}
    assert set(spec.no_forward_modules) <= classes and not set(spec.no_forward_modules) & set(spec.wrap_units)


# -- layouts and dtypes -----------------------------------------------------------------------------


def test_the_legacy_block_layout_loads():
    source = tiny_policy(seed=3)
    pattern, legacy_name = r"^model\.mot\.layers\.(\d+)\.blocks\.(\w+)\.", r"model.mot.mixtures.\2.blocks.\1."
    legacy = {re.sub(pattern, legacy_name, k): v for k, v in source.state_dict().items()}
    assert "model.mot.mixtures.video.blocks.1.self_attn.q.weight" in legacy
    target = tiny_policy(seed=4)
    target.load_state_dict(legacy, strict=True)
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name


def test_torch_dtype_casts_every_parameter_and_freeze_reaches_the_layers():
    assert {p.dtype for p in FastWAMPolicy(tiny(torch_dtype="bfloat16")).parameters()} == {torch.bfloat16}
    policy = tiny_policy(freeze_video_expert=True)
    for name, p in policy.named_parameters():
        video = ".blocks.video." in name or ".mixtures.video." in name
        assert p.requires_grad != video, name
    trainable = {id(p) for p in policy.parameters() if p.requires_grad}
    assert {id(p) for p in policy.get_optim_params()} == trainable


def test_lora_targets_are_the_action_experts_linears_only():
    pattern = FastWAMConfig.spec.peft_targets
    names = [n for n, m in tiny_policy().named_modules() if isinstance(m, torch.nn.Linear)]
    hits = [n for n in names if re.fullmatch(pattern, n)]
    assert len(hits) == 2 * 10  # per layer: self/cross q, k, v, o and the two FFN linears
    assert all(".blocks.action." in n for n in hits)


# -- the three MoT paths ----------------------------------------------------------------------------


def test_every_path_enters_each_layer_through_its_forward():
    policy = tiny_policy().eval()
    calls = []
    for layer in policy.model.mot.layers:
        layer.register_forward_pre_hook(lambda module, args, kwargs: calls.append(args[0]), with_kwargs=True)
    x = inputs()
    with torch.no_grad():
        joint(policy, x)
        cached(policy, x)
    assert calls == ["joint", "joint", "video_prefill", "video_prefill", "action_cached", "action_cached"]


def test_cached_action_equals_the_joint_pass_and_ignores_later_frames():
    """LeRobot's semantics with first_frame_causal masks: actions see the first (clean) frame and themselves,
    the first frame sees only itself, so the cached path computes the joint pass's action velocity (the
    attention sums run over other key sets: 1e-5, measured 9e-8) and later frames cannot change it."""
    policy = tiny_policy().eval()
    x = inputs()
    with torch.no_grad():
        _, action = joint(policy, x)
        other = dict(x, latents=x["latents"].clone())
        other["latents"][:, :, 1:] = torch.randn_like(other["latents"][:, :, 1:])
        video, action_other = joint(policy, other)
        from_cache = cached(policy, x)
    assert torch.equal(action, action_other)  # masked keys weigh exactly 0
    assert video.shape == x["latents"].shape
    torch.testing.assert_close(from_cache, action, rtol=0, atol=1e-5)
    assert not torch.equal(action, joint(policy, dict(x, actions=x["actions"] + 1))[1])


def test_the_video_ignores_the_actions_and_its_first_frame_the_rest():
    policy = tiny_policy().eval()
    x = inputs()
    with torch.no_grad():
        video, _ = joint(policy, x)
        video_new_actions, _ = joint(policy, dict(x, actions=torch.randn_like(x["actions"])))
        changed = dict(x, latents=x["latents"].clone())
        changed["latents"][:, :, 2] += 1
        video_changed, _ = joint(policy, changed)
    assert torch.equal(video, video_new_actions)
    assert torch.equal(video[:, :, 0], video_changed[:, :, 0]) and not torch.equal(video, video_changed)


# -- RoPE and materialisation -----------------------------------------------------------------------


def test_rope_after_meta_materialisation_equals_a_fresh_build():
    real = tiny_policy(seed=5).eval()
    with torch.device("meta"):
        lazy = FastWAMPolicy(tiny())
    lazy.to_empty(device="cpu")
    lazy.load_state_dict(real.state_dict())
    lazy.eval()
    for name in ("video_expert", "action_expert"):
        table = getattr(lazy.model, name).rope.on(torch.device("cpu"))
        assert table.device.type == "cpu"
        assert torch.equal(table, getattr(real.model, name).rope.on(torch.device("cpu")))
    assert torch.equal(lazy.model.video_expert.rope.host(), rope.video_rotary_table(16))
    x = inputs()
    with torch.no_grad():
        for got, want in zip(joint(lazy, x), joint(real, x), strict=True):
            assert torch.equal(got, want)


def test_rotation_and_tables_are_wans():
    table = rope.video_rotary_table(16)
    assert table.shape == (1024, 8) and table.dtype == torch.complex128
    assert rope.video_axis_widths(16) == (8, 4, 4) and rope.video_axis_widths(128) == (44, 42, 42)
    phasors = rope.video_token_phasors(table, 2, 3, 4)
    f, h, w = 1, 2, 3  # frame-major token order
    token = (f * 3 + h) * 4 + w
    assert torch.equal(phasors[token, 0], torch.cat([table[f, :4], table[h, 4:6], table[w, 6:8]]))
    x = torch.randn(1, 24, 2 * 16, dtype=torch.float64)
    turned = rope.rotate(x, phasors, 2, torch.float32)
    angle = phasors.angle().squeeze(1)  # (24, 8)
    pairs = x.reshape(1, 24, 2, 8, 2)
    cos, sin = angle.cos()[None, :, None], angle.sin()[None, :, None]
    real, imag = pairs[..., 0], pairs[..., 1]
    expected = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1).reshape(1, 24, 32)
    assert turned.dtype == torch.float32
    torch.testing.assert_close(turned.double(), expected, rtol=1e-6, atol=1e-6)
    emb = rope.sinusoidal_embedding(4, torch.tensor([0.0, 2.0]))  # ω = 1, 10000^(-1/2)
    angles = torch.tensor([2.0, 0.02], dtype=torch.float64)
    assert emb.dtype == torch.float64
    torch.testing.assert_close(emb[1], torch.cat([angles.cos(), angles.sin()]))
    assert emb[0].tolist() == [1.0, 1.0, 0.0, 0.0]


# -- masks ------------------------------------------------------------------------------------------


def test_masks_route_video_and_actions():
    T, F = True, False
    first = attention.video_self_mask("first_frame_causal", 4, 2, "cpu")
    assert first.tolist() == [[T, T, F, F], [T, T, F, F], [T, T, T, T], [T, T, T, T]]
    per_frame = attention.video_self_mask("per_frame_causal", 4, 2, "cpu")
    assert per_frame.tolist() == [[T, T, F, F], [T, T, F, F], [T, T, T, T], [T, T, T, T]]
    assert attention.video_self_mask("per_frame_causal", 6, 2, "cpu")[2].tolist() == [T, T, T, T, F, F]
    assert attention.video_self_mask("bidirectional", 3, 1, "cpu").all()
    joint_mask = attention.mot_attention_mask(first, 2, 2)
    assert joint_mask[:4, 4:].sum() == 0  # video never sees actions
    assert joint_mask[4:].tolist() == [[T, T, F, F, T, T]] * 2  # actions: first frame and all actions
    assert (
        attention.group_causal_mask(2, 2, 3, "group_diagonal").tolist()
        == [[T, T, T, F, F, F]] * 2 + [[F, F, F, T, T, T]] * 2
    )
    assert attention.group_causal_mask(2, 1, 1, "causal").tolist() == [[T, F], [T, T]]


def test_an_action_conditioned_video_dit_sees_its_transitions_actions():
    conditioned = {"action_conditioned": True, "action_group_causal_mask_mode": "group_diagonal"}
    policy = tiny_policy(video=conditioned)
    assert "model.mot.mixtures.video.action_embedding.weight" in policy.state_dict()
    x = inputs()
    embedding = policy.model.video_expert.embed(
        x["latents"], x["timestep_video"], x["context"], x["context_mask"], x["actions"]
    )
    mask = embedding.stream.context_mask  # (B, S, L + horizon)
    assert mask.shape == (B, 18, 5 + HORIZON)
    assert not mask[:, :6, 5:].any()  # the clean first frame reads no action
    assert mask[:, 6:12, 5:9].all() and not mask[:, 6:12, 9:].any()  # frame 1: transition 0's four actions
    assert mask[:, 12:, 9:].all() and not mask[:, 12:, 5:9].any()  # frame 2: transition 1's only (diagonal)
    assert torch.equal(mask[1, :, :5], x["context_mask"][1].expand(18, -1))


# -- precision --------------------------------------------------------------------------------------


def test_video_time_embedding_and_head_run_in_fp32_under_bf16_weights_and_autocast():
    policy = tiny_policy(torch_dtype="bfloat16")
    reference = tiny_policy(torch_dtype="float32")
    reference.load_state_dict({k: v.float() for k, v in policy.state_dict().items()})
    x = inputs()
    args = (x["latents"], torch.tensor([512.0, 768.0]), x["context"], x["context_mask"])  # exact in bf16
    video = policy.model.video_expert.embed(*args)
    assert video.t.dtype == torch.float32 and video.stream.t_mod.dtype == torch.bfloat16
    assert torch.equal(video.t, reference.model.video_expert.embed(*args).t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(policy.model.video_expert.embed(*args).t, video.t)
    out = policy.model.video_expert.unembed(video.stream.tokens, video)
    assert out.dtype == torch.float32
    action = policy.model.action_expert.embed(
        x["actions"], x["timestep_action"], x["context"], x["context_mask"]
    )
    assert action.stream.t_mod.dtype == torch.bfloat16  # LeRobot keeps the action DiT in the weights' dtype
