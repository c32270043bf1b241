"""pi0: LeRobot's shapes at full size (meta device), the tiny variant's training and inference paths,
freezing, and the config's LeRobot compatibility rules."""

from __future__ import annotations

import json

import pytest
import torch
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.pi0.config import PI0Config
from lerobot_cli.policies.pi0.modeling import PI0Policy
from lerobot_cli.policies.serialization import (
    policy_config_extensions,
    policy_config_from_dict,
    policy_config_to_dict,
)

PREFIX = "model.paligemma_with_expert."
FEATURES = {
    "input_features": {
        "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 56, 56)),
        "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
    },
    "output_features": {"action": PolicyFeature(FeatureType.ACTION, (6,))},
}
TINY = {
    "paligemma_variant": "gemma_tiny",
    "action_expert_variant": "gemma_tiny",
    "vision_variant": "tiny",
    "image_resolution": (56, 56),
    "chunk_size": 4,
    "n_action_steps": 4,
    "tokenizer_max_length": 8,
}


def tiny(**overrides) -> PI0Config:
    return PI0Config(**{**TINY, **FEATURES, **overrides})


def batch(batch_size: int = 3, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([8, 5, 3, 8][:batch_size])
    return {
        "observation.images.top": torch.rand(batch_size, 3, 48, 64, generator=g),  # resized with padding
        "observation.state": torch.randn(batch_size, 6, generator=g),
        "action": torch.randn(batch_size, 4, 6, generator=g),
        "observation.language.tokens": torch.randint(0, 300, (batch_size, 8), generator=g),
        "observation.language.attention_mask": torch.arange(8)[None] < lengths[:, None],
    }


@pytest.fixture(scope="module")
def full_size() -> PI0Policy:
    with torch.device("meta"):
        return PI0Policy(PI0Config(**FEATURES))


def test_full_size_has_lerobot_keys_shapes_and_count(full_size):
    sd = full_size.state_dict()
    # LeRobot 0.6.1 (transformers 5.5): 778 keys, 4,028,019,472 values, both lm_heads included.
    assert len(sd) == 778
    assert sum(p.numel() for p in full_size.parameters()) == 4_028_019_472
    assert sum(v.numel() for v in sd.values()) == 4_028_019_472
    vision = PREFIX + "paligemma.model.vision_tower.vision_model."
    expected = {
        vision + "embeddings.patch_embedding.weight": (1152, 3, 14, 14),
        vision + "embeddings.position_embedding.weight": (256, 1152),
        vision + "encoder.layers.26.mlp.fc1.weight": (4304, 1152),
        vision + "post_layernorm.bias": (1152,),
        PREFIX + "paligemma.model.multi_modal_projector.linear.weight": (2048, 1152),
        PREFIX + "paligemma.model.language_model.embed_tokens.weight": (257152, 2048),
        PREFIX + "paligemma.model.language_model.layers.17.mlp.gate_proj.weight": (16384, 2048),
        PREFIX + "paligemma.model.language_model.layers.0.self_attn.k_proj.weight": (256, 2048),
        PREFIX + "paligemma.model.language_model.norm.weight": (2048,),
        PREFIX + "paligemma.lm_head.weight": (257152, 2048),
        PREFIX + "gemma_expert.lm_head.weight": (257152, 1024),
        PREFIX + "gemma_expert.model.layers.17.self_attn.q_proj.weight": (2048, 1024),
        PREFIX + "gemma_expert.model.layers.0.self_attn.o_proj.weight": (1024, 2048),
        PREFIX + "gemma_expert.model.layers.0.input_layernorm.weight": (1024,),
        PREFIX + "gemma_expert.model.norm.weight": (1024,),
        "model.state_proj.weight": (1024, 32),
        "model.action_in_proj.weight": (1024, 32),
        "model.action_out_proj.bias": (32,),
        "model.action_time_mlp_in.weight": (1024, 2048),
        "model.action_time_mlp_out.weight": (1024, 1024),
    }
    assert {k: tuple(sd[k].shape) for k in expected} == expected
    assert not any(k.startswith(PREFIX + "gemma_expert.model.embed_tokens") for k in sd)
    assert all(v.dtype == torch.float32 for v in sd.values())


def test_full_size_bfloat16_keeps_lerobots_fp32_parts():
    with torch.device("meta"):
        policy = PI0Policy(PI0Config(**FEATURES, dtype="bfloat16"))
    dtypes = {n: p.dtype for n, p in policy.named_parameters()}
    assert (
        dtypes[PREFIX + "paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"]
        == torch.float32
    )
    assert dtypes[PREFIX + "gemma_expert.model.layers.3.input_layernorm.weight"] == torch.float32
    assert dtypes[PREFIX + "paligemma.model.language_model.norm.weight"] == torch.float32
    assert dtypes[PREFIX + "paligemma.model.language_model.layers.3.mlp.up_proj.weight"] == torch.bfloat16
    assert dtypes["model.action_in_proj.weight"] == torch.float32  # outside the towers LeRobot casts


def test_tiny_trains_and_predicts_chunks():
    torch.manual_seed(0)
    policy = PI0Policy(tiny())
    optimizer = torch.optim.AdamW(policy.get_optim_params(), lr=1e-3)
    b = batch()
    noise, time = torch.randn(3, 4, 32), torch.full((3,), 0.5)
    first = None
    for _ in range(15):
        loss, info = policy(b, noise=noise, time=time)
        assert loss.shape == () and torch.isfinite(loss) and info == {}
        first = first if first is not None else float(loss.detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss) < 0.7 * first
    chunk = policy.predict_action_chunk(b, noise=noise)
    assert chunk.shape == (3, 4, 6) and not policy.training
    # The same noise gives the same chunk: inference is deterministic given its noise.
    assert torch.equal(chunk, policy.predict_action_chunk(b, noise=noise))
    policy.reset()
    actions = [policy.select_action(b) for _ in range(4)]
    assert all(a.shape == (3, 6) for a in actions)


def test_cached_prefix_inference_equals_recomputing_the_whole_sequence():
    """The denoise step reuses the prefix keys/values; running prefix + suffix jointly must give the
    same velocity (the training path's attention pattern, at a fixed time)."""
    torch.manual_seed(0)
    policy = PI0Policy(tiny()).eval()
    model = policy.model
    b = batch()
    images, image_masks = policy._images(b)
    tokens, masks = policy._language(b)
    state = policy._state(b)
    x_t, time = torch.randn(3, 4, 32), torch.full((3,), 0.3)
    with torch.no_grad():
        prefix, pads, starts = model.embed_prefix(images, image_masks, tokens, masks)
        from lerobot_cli.policies.common.masks import attention_mask_2d

        _, cache = model.paligemma_with_expert.run(
            [prefix, None], attention_mask_2d(pads, starts), torch.cumsum(pads, dim=1) - 1
        )
        cached = model.denoise_step(state, pads, cache, x_t, time)
        suffix, s_pads, s_starts, _ = model.embed_suffix(state, x_t, time)
        all_pads = torch.cat([pads, s_pads], dim=1)
        mask = attention_mask_2d(all_pads, torch.cat([starts.to(s_starts.dtype), s_starts], dim=1))
        (_, out), _ = model.paligemma_with_expert.run(
            [prefix, suffix], mask, torch.cumsum(all_pads, dim=1) - 1
        )
        joint = model.action_out_proj(out[:, -4:])
    torch.testing.assert_close(cached, joint, rtol=1e-5, atol=1e-6)


def test_missing_camera_becomes_a_masked_minus_one_image():
    policy = PI0Policy(tiny(empty_cameras=1))
    images, masks = policy._images(batch())
    assert len(images) == 2
    assert torch.equal(images[1], torch.full_like(images[0], -1.0)) and not masks[1].any() and masks[0].all()
    assert images[0].shape[-2:] == (56, 56) and images[0].min() >= -1.0 and images[0].max() <= 1.0


UNREAD = (
    "lm_head.weight",
    "language_model.norm.weight",
    "language_model.layers.1.self_attn.o_proj.weight",
    "language_model.layers.1.post_attention_layernorm.weight",
    "language_model.layers.1.mlp.gate_proj.weight",
    "language_model.layers.1.mlp.up_proj.weight",
    "language_model.layers.1.mlp.down_proj.weight",
)


def test_frozen_parts_take_no_gradient_and_unread_parameters_are_always_frozen():
    """Every trainable parameter gets a gradient (so DDP needs no unused-parameter search); the frozen
    ones are the vision tower (asked for) and what no computation reads (lm_heads, the VLM's last outputs)."""
    unfrozen = PI0Policy(tiny())
    loss, _ = unfrozen(batch())
    loss.backward()
    assert {n for n, p in unfrozen.named_parameters() if not p.requires_grad} == {
        n for n, _ in unfrozen.named_parameters() if n.endswith(UNREAD)
    }
    policy = PI0Policy(tiny(freeze_vision_encoder=True))
    loss, _ = policy(batch())
    loss.backward()
    for name, p in policy.named_parameters():
        frozen = "vision_tower" in name or name.endswith(UNREAD)
        assert p.requires_grad is not frozen, name
        assert (p.grad is None) is frozen, name
    expert_only = PI0Policy(tiny(train_expert_only=True))
    trainable = {n for n, p in expert_only.named_parameters() if p.requires_grad}
    assert trainable and not any(".paligemma." in n for n in trainable)
    assert not expert_only.train().model.paligemma_with_expert.paligemma.training


def test_config_json_is_lerobots_when_only_lerobot_settings_are_used():
    data = policy_config_to_dict(PI0Config(**FEATURES))
    assert data["type"] == "pi0" and "vision_variant" not in data and "tokenizer_name" not in data
    assert data["paligemma_variant"] == "gemma_2b" and data["tokenizer_max_length"] == 48
    assert data["normalization_mapping"] == {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    # Our settings go to config_extensions.json, whatever their values: config.json stays LeRobot's.
    ours, extensions = policy_config_to_dict(tiny()), policy_config_extensions(tiny())
    assert "vision_variant" not in ours and extensions["vision_variant"] == "tiny"
    assert policy_config_from_dict(json.loads(json.dumps({**ours, **extensions}))) == tiny()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"paligemma_variant": "gemma_7b"}, r"--policy.paligemma_variant: invalid choice 'gemma_7b'"),
        ({"image_resolution": (56, 42)}, r"--policy.image_resolution must be square"),
        ({"image_resolution": (50, 50)}, r"multiple of the SigLIP patch size 14"),
        # passed the modulo test, then divided by zero at step 1 (no patch to attend to)
        (
            {"image_resolution": (0, 0)},
            r"must be \[N, N\] with N a positive multiple of the SigLIP patch size 14",
        ),
        (
            {"image_resolution": (-14, -14)},
            r"positive multiple of the SigLIP patch size 14 \(e.g. \[224, 224\]\)",
        ),
        ({"n_action_steps": 9}, r"n_action_steps \(9\) cannot be greater than --policy.chunk_size \(4\)"),
        ({"use_relative_actions": True}, r"use_relative_actions=true is not supported here"),
        ({"compile_model": True}, r"compile_model=true is not supported here"),
        ({"dtype": "float16"}, r"--policy.dtype: invalid choice 'float16'"),
    ],
)
def test_config_refusals(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny(**overrides)


def test_state_wider_than_max_state_dim_is_refused_when_built():
    config = tiny(max_state_dim=4)
    with pytest.raises(ValueError, match=r"the state has 6 dimensions but --policy.max_state_dim is 4"):
        PI0Policy(config)


def test_bfloat16_bases_train_with_fp32_vision_and_norms():
    torch.manual_seed(0)
    policy = PI0Policy(tiny(dtype="bfloat16"))
    loss, _ = policy(batch(), noise=torch.randn(3, 4, 32), time=torch.full((3,), 0.5))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    assert grads[PREFIX + "gemma_expert.model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert (
        grads[PREFIX + "paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"].dtype
        == torch.float32
    )
    chunk = policy.predict_action_chunk(batch(), noise=torch.randn(3, 4, 32))
    assert chunk.dtype == torch.float32 and torch.isfinite(chunk).all()


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_gradient_checkpointing_recomputes_each_joint_layer_with_the_same_gradients(mode, monkeypatch):
    """--policy.gradient_checkpointing=true is lerobot-parallel's activation checkpointing of each wrap unit
    (joint layer pairs, SigLIP layers); tiny widths but 6 layers deep: gradients equal, saved bytes drop."""
    import attrs
    from lerobot_cli.policies.common.paligemma import variants
    from lerobot_parallel import AcceleratorConfig, ParallelismConfig
    from lerobot_parallel.config import ActivationCheckpointingConfig
    from lerobot_parallel.plan import build_plan
    from lerobot_parallel.runtime import ParallelRuntime
    from lerobot_parallel.testing import saved_tensor_bytes
    from lerobot_parallel.wrap import wrap_model

    deep = attrs.evolve(variants.GEMMA_VARIANTS["gemma_tiny"], depth=6)
    monkeypatch.setitem(variants.GEMMA_VARIANTS, "gemma_tiny", deep)
    monkeypatch.setitem(
        variants.VISION_VARIANTS, "tiny", attrs.evolve(variants.VISION_VARIANTS["tiny"], depth=6)
    )
    b, noise, time = batch(), torch.randn(3, 4, 32), torch.full((3,), 0.4)
    runtime = ParallelRuntime.preview(ParallelismConfig())
    grads, saved = [], []
    for checkpointing in ("none", mode):
        torch.manual_seed(0)
        policy = PI0Policy(tiny())
        accelerator = AcceleratorConfig(activation_checkpointing=ActivationCheckpointingConfig(checkpointing))
        plan = build_plan(policy, runtime, accelerator, default_unit_groups=PI0Policy._fsdp_unit_groups)
        if checkpointing != "none":
            assert "PaliGemmaLayer+ExpertLayer" in {block.class_name for block in plan.blocks}
        model = wrap_model(policy, runtime, plan).model
        torch.manual_seed(1)
        (loss, _), nbytes = saved_tensor_bytes(lambda m=model: m(b, noise=noise, time=time))
        loss.backward()
        saved.append(nbytes)
        grads.append({n: p.grad for n, p in policy.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        torch.testing.assert_close(
            grads[1][name], g, rtol=0, atol=0, msg=name
        )  # bitwise: the same ops recomputed
    assert len(policy.model.paligemma_with_expert.expert_model.layers) == 6
    # measured: full keeps 8 % of the bytes, selective 42 %
    assert saved[1] <= 0.5 * saved[0], saved


def test_openpi_layout_files_load_like_lerobot_loads_them(tmp_path):
    """A converted openpi file: no ``model.`` prefix, older time-MLP names, no token embedding (tied to
    lm_head there), a SigLIP without the vision_model level. LeRobot's from_pretrained accepts it; so do
    we."""
    from lerobot_cli.policies.registry import state_dict_adapter
    from lerobot_cli.policies.weights import load_weights
    from safetensors.torch import save_file

    torch.manual_seed(0)
    source = PI0Policy(tiny())
    embed = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    head = "paligemma_with_expert.paligemma.lm_head.weight"
    openpi = {}
    for key, value in source.state_dict().items():
        key = (
            key.removeprefix("model.").replace("action_time_mlp_", "time_mlp_").replace(".vision_model.", ".")
        )
        if key != embed:
            openpi[key] = value.clone()
    openpi[head] = source.state_dict()["model." + embed].clone()
    save_file(openpi, str(tmp_path / "model.safetensors"))
    target = PI0Policy(tiny())
    load_weights(target, tmp_path / "model.safetensors", adapt=state_dict_adapter(target.config))
    loaded = target.state_dict()
    for key, value in source.state_dict().items():
        expected = value if key != "model." + head else source.state_dict()["model." + embed]
        assert torch.equal(loaded[key], expected), key


def test_a_pretrained_directory_in_openpis_layout_loads_through_the_spec(tmp_path):
    """``load_policy`` (what --policy.path runs) applies the spec's ``state_dict_adapter``."""
    from lerobot_cli.policies.serialization import save_policy_config
    from lerobot_cli.policies.weights import load_policy
    from safetensors.torch import save_file

    torch.manual_seed(0)
    source = PI0Policy(tiny())
    state = {
        k.removeprefix("model.").replace("action_time_mlp_", "time_mlp_"): v.clone()
        for k, v in source.state_dict().items()
    }
    save_file(state, str(tmp_path / "model.safetensors"))
    save_policy_config(source.config, tmp_path)
    _, loaded = load_policy(tmp_path)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in source.state_dict().items())


def test_pi05_drops_pi0s_state_proj_and_renames_the_time_mlp_as_lerobot_does(tmp_path):
    from lerobot_cli.policies.pi05.config import PI05Config
    from lerobot_cli.policies.pi05.modeling import PI05Policy
    from lerobot_cli.policies.registry import state_dict_adapter
    from lerobot_cli.policies.weights import load_weights
    from safetensors.torch import save_file

    config = PI05Config(**{**TINY, **FEATURES})
    source = PI05Policy(config)
    state = {
        k.replace("model.time_mlp_", "model.action_time_mlp_"): v.clone()
        for k, v in source.state_dict().items()
    }
    state["model.state_proj.weight"] = torch.zeros(32, 32)
    save_file(state, str(tmp_path / "model.safetensors"))
    target = PI05Policy(config)
    load_weights(target, tmp_path / "model.safetensors", adapt=state_dict_adapter(config))
    assert all(torch.equal(target.state_dict()[k], v) for k, v in source.state_dict().items())


def test_size_based_units_never_pick_modules_whose_forward_is_not_called():
    """min_num_params must not make a unit of a tower model or the projections holder (their forward never
    runs, so FSDP would never gather them); naming one is refused; joint layers still pair up."""
    from lerobot_parallel import AcceleratorConfig, FSDPConfig, ParallelismConfig, ShardingError, build_plan
    from lerobot_parallel.runtime import ParallelRuntime

    fsdp2 = ParallelRuntime.preview(ParallelismConfig(dp_shard=2))
    policy = PI0Policy(tiny())
    plan = build_plan(policy, fsdp2, AcceleratorConfig(fsdp=FSDPConfig(min_num_params=2000)))
    classes = {c for u in plan.units for c in u.class_name.split("+")}
    assert not classes & set(PI0Policy._fsdp_no_forward_modules), classes
    assert all(
        u.members for u in plan.units if "PaliGemmaLayer" in u.class_name or "ExpertLayer" in u.class_name
    )
    with pytest.raises(ShardingError, match="GemmaModel never runs its forward"):
        build_plan(policy, fsdp2, AcceleratorConfig(fsdp=FSDPConfig(wrap_modules=("GemmaModel",))))
