"""pi05: LeRobot's shapes at full size (meta device), the tiny variant's training and inference paths,
what takes no gradient, the default LoRA targets and the config's LeRobot fields. The batch, tiny sizes
and features are test_policy_pi0's (loaded from its file: pytest imports test modules by path)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from lerobot_cli.policies import registry
from lerobot_cli.policies.common.masks import attention_mask_2d
from lerobot_cli.policies.pi0.config import PI0Config
from lerobot_cli.policies.pi0.modeling import PI0Policy
from lerobot_cli.policies.pi05.config import PI05Config
from lerobot_cli.policies.pi05.modeling import PI05Policy
from lerobot_cli.policies.serialization import (
    policy_config_extensions,
    policy_config_from_dict,
    policy_config_to_dict,
)

_spec = importlib.util.spec_from_file_location("_pi0_cases", Path(__file__).with_name("test_policy_pi0.py"))
pi0_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pi0_cases)
PREFIX, FEATURES, TINY, UNREAD, batch = (
    pi0_cases.PREFIX,
    pi0_cases.FEATURES,
    pi0_cases.TINY,
    pi0_cases.UNREAD,
    pi0_cases.batch,
)
EXPERT = PREFIX + "gemma_expert.model."

# LeRobot 0.6.1's PI05Config fields (dataclasses.fields, PreTrainedConfig's included), in its order.
LEROBOT_PI05_FIELDS = (
    "n_obs_steps",
    "input_features",
    "output_features",
    "device",
    "use_amp",
    "use_peft",
    "push_to_hub",
    "repo_id",
    "private",
    "tags",
    "license",
    "pretrained_path",
    "pretrained_revision",
    "paligemma_variant",
    "action_expert_variant",
    "dtype",
    "chunk_size",
    "n_action_steps",
    "max_state_dim",
    "max_action_dim",
    "num_inference_steps",
    "time_sampling_beta_alpha",
    "time_sampling_beta_beta",
    "time_sampling_scale",
    "time_sampling_offset",
    "min_period",
    "max_period",
    "use_relative_actions",
    "relative_exclude_joints",
    "action_feature_names",
    "rtc_config",
    "image_resolution",
    "empty_cameras",
    "tokenizer_max_length",
    "normalization_mapping",
    "gradient_checkpointing",
    "compile_model",
    "compile_mode",
    "freeze_vision_encoder",
    "train_expert_only",
    "optimizer_lr",
    "optimizer_betas",
    "optimizer_eps",
    "optimizer_weight_decay",
    "optimizer_grad_clip_norm",
    "scheduler_warmup_steps",
    "scheduler_decay_steps",
    "scheduler_decay_lr",
)


def tiny(**overrides) -> PI05Config:
    return PI05Config(**{**TINY, **FEATURES, **overrides})


@pytest.fixture(scope="module")
def full_size() -> PI05Policy:
    with torch.device("meta"):
        return PI05Policy(PI05Config(**FEATURES))


def test_full_size_has_lerobot_keys_shapes_and_count(full_size):
    sd = full_size.state_dict()
    # LeRobot 0.6.1 (transformers 5.5): 813 keys, 4,143,404,816 values, both lm_heads included.
    assert len(sd) == 813
    assert sum(p.numel() for p in full_size.parameters()) == 4_143_404_816
    assert sum(v.numel() for v in sd.values()) == 4_143_404_816
    expected = {
        EXPERT + "layers.0.input_layernorm.dense.weight": (3072, 1024),
        EXPERT + "layers.17.post_attention_layernorm.dense.bias": (3072,),
        EXPERT + "norm.dense.weight": (3072, 1024),
        EXPERT + "norm.dense.bias": (3072,),
        PREFIX + "paligemma.model.language_model.layers.3.input_layernorm.weight": (
            2048,
        ),  # the VLM's stay plain
        PREFIX + "paligemma.model.language_model.norm.weight": (2048,),
        "model.time_mlp_in.weight": (1024, 1024),
        "model.time_mlp_out.bias": (1024,),
        "model.action_in_proj.weight": (1024, 32),
    }
    assert {k: tuple(sd[k].shape) for k in expected} == expected
    with torch.device("meta"):
        pi0 = PI0Policy(PI0Config(**FEATURES)).state_dict()
    # pi0's keys with the state projection and the action-time MLP gone, the time MLP in their place, and
    # every expert norm adaptive (its scale `weight` replaced by `dense`): the towers are otherwise pi0's.
    adaptive = {k for k in pi0 if k.startswith(EXPERT) and k.endswith("norm.weight")}
    assert len(adaptive) == 2 * 18 + 1
    dropped = adaptive | {k for k in pi0 if k.startswith(("model.state_proj.", "model.action_time_mlp_"))}
    added = {k[: -len("weight")] + f"dense.{p}" for k in adaptive for p in ("weight", "bias")}
    added |= {f"model.time_mlp_{io}.{p}" for io in ("in", "out") for p in ("weight", "bias")}
    assert set(sd) == (set(pi0) - dropped) | added
    assert all(tuple(sd[k].shape) == tuple(pi0[k].shape) for k in set(sd) & set(pi0))


def test_full_size_bfloat16_keeps_lerobots_fp32_parts():
    with torch.device("meta"):
        policy = PI05Policy(PI05Config(**FEATURES, dtype="bfloat16"))
    dtypes = {n: p.dtype for n, p in policy.named_parameters()}
    # LeRobot keeps every parameter whose name contains a norm in fp32: the adaptive norms' dense too.
    assert dtypes[EXPERT + "layers.3.input_layernorm.dense.weight"] == torch.float32
    assert dtypes[EXPERT + "norm.dense.bias"] == torch.float32
    assert dtypes[EXPERT + "layers.3.mlp.up_proj.weight"] == torch.bfloat16
    assert dtypes["model.time_mlp_in.weight"] == torch.float32  # outside the towers LeRobot casts


def test_bfloat16_bases_train_with_fp32_vision_and_norms():
    """bf16 towers; the time MLP and the adaptive norms (dense included) stay fp32, as in LeRobot."""
    torch.manual_seed(0)
    policy = PI05Policy(tiny(dtype="bfloat16"))
    loss, _ = policy(batch(), noise=torch.randn(3, 4, 32), time=torch.full((3,), 0.5))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    assert grads[EXPERT + "layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert grads[EXPERT + "layers.0.input_layernorm.dense.weight"].dtype == torch.float32
    assert grads["model.time_mlp_out.weight"].dtype == torch.float32
    chunk = policy.predict_action_chunk(batch(), noise=torch.randn(3, 4, 32))
    assert chunk.dtype == torch.float32 and torch.isfinite(chunk).all()


def test_tiny_trains_and_predicts_chunks():
    torch.manual_seed(0)
    policy = PI05Policy(tiny())
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
    assert float(loss.detach()) < 0.7 * first
    chunk = policy.predict_action_chunk(b, noise=noise)
    assert chunk.shape == (3, 4, 6) and not policy.training
    assert torch.equal(chunk, policy.predict_action_chunk(b, noise=noise))
    # The model never reads observation.state (the pre-processor put it into the prompt's tokens).
    other_state = {**b, "observation.state": torch.randn(3, 6)}
    assert torch.equal(chunk, policy.predict_action_chunk(other_state, noise=noise))
    policy.reset()
    actions = [policy.select_action(b) for _ in range(4)]
    assert all(a.shape == (3, 6) for a in actions)


def test_time_conditions_the_expert_norms():
    """The suffix is the action tokens alone; the time reaches the expert only as the adaptive norms'
    condition (time_mlp_in → silu → time_mlp_out → silu), so with non-zero `dense` weights it moves the
    velocity while the action tokens stay the same."""
    torch.manual_seed(0)
    policy = PI05Policy(tiny()).eval()
    model = policy.model
    x_t = torch.randn(3, 4, 32)
    early, early_pads, early_starts, early_cond = model.embed_suffix(None, x_t, torch.full((3,), 0.9))
    late, _, _, late_cond = model.embed_suffix(None, x_t, torch.full((3,), 0.1))
    assert early.shape == (3, 4, 32) and torch.equal(early, late) and early_pads.all()
    assert early_starts[0].tolist() == [1, 0, 0, 0]  # one block, after the prefix
    assert early_cond.shape == (3, 32) and not torch.equal(early_cond, late_cond)
    with torch.no_grad():
        for module in model.modules():
            if getattr(module, "dense", None) is not None:
                module.dense.weight.normal_(0.0, 0.1)
        b = batch()
        noise = torch.randn(3, 4, 32)
        losses = [policy(b, noise=noise, time=torch.full((3,), t))[0] for t in (0.9, 0.1)]
    assert not torch.allclose(*losses)


def test_cached_prefix_inference_equals_recomputing_the_whole_sequence():
    torch.manual_seed(0)
    policy = PI05Policy(tiny()).eval()
    model = policy.model
    with torch.no_grad():
        for module in model.modules():  # non-zero modulation, so the condition's path is exercised
            if getattr(module, "dense", None) is not None:
                module.dense.weight.normal_(0.0, 0.1)
    b = batch()
    images, image_masks = policy._images(b)
    tokens, masks = policy._language(b)
    x_t, time = torch.randn(3, 4, 32), torch.full((3,), 0.3)
    with torch.no_grad():
        prefix, pads, starts = model.embed_prefix(images, image_masks, tokens, masks)
        _, cache = model.paligemma_with_expert.run(
            [prefix, None], attention_mask_2d(pads, starts), torch.cumsum(pads, dim=1) - 1
        )
        cached = model.denoise_step(None, pads, cache, x_t, time)
        suffix, s_pads, s_starts, cond = model.embed_suffix(None, x_t, time)
        all_pads = torch.cat([pads, s_pads], dim=1)
        mask = attention_mask_2d(all_pads, torch.cat([starts.to(s_starts.dtype), s_starts], dim=1))
        (_, out), _ = model.paligemma_with_expert.run(
            [prefix, suffix], mask, torch.cumsum(all_pads, dim=1) - 1, (None, cond)
        )
        joint = model.action_out_proj(out[:, -4:])
    torch.testing.assert_close(cached, joint, rtol=1e-5, atol=1e-6)


def test_frozen_parts_take_no_gradient_and_unread_parameters_are_always_frozen():
    """What takes no gradient in pi05 is what takes none in pi0 (checked with everything trainable): the
    lm_heads and the VLM's last outputs (final norm, last layer's o_proj, post-attention norm and MLP),
    because pi05 too reads only the prefix's keys/values from the VLM. pi05's own parts all get one: the
    expert's final norm is adaptive but still read, and the time MLP feeds every expert norm. Two get
    gradients that are zero but not None, and stay trainable as in LeRobot: the last VLM layer's q_proj
    (its queries only produce unread prefix outputs; AdamW's weight decay still moves it in LeRobot) and,
    before the first update only, the time MLP (the norms' `dense` start at zero weights)."""
    everything = PI05Policy(tiny())
    everything.requires_grad_(True)
    loss, _ = everything(batch())
    loss.backward()
    no_grad = {n for n, p in everything.named_parameters() if p.grad is None}
    assert no_grad == {n for n, _ in everything.named_parameters() if n.endswith(UNREAD)}
    zero = {n for n, p in everything.named_parameters() if p.grad is not None and not p.grad.any()}
    assert zero == {
        PREFIX + "paligemma.model.language_model.layers.1.self_attn.q_proj.weight",
        *(f"model.time_mlp_{io}.{p}" for io in ("in", "out") for p in ("weight", "bias")),
    }

    unfrozen = PI05Policy(tiny())
    assert {n for n, p in unfrozen.named_parameters() if not p.requires_grad} == no_grad
    policy = PI05Policy(tiny(freeze_vision_encoder=True))
    loss, _ = policy(batch())
    loss.backward()
    for name, p in policy.named_parameters():
        frozen = "vision_tower" in name or name.endswith(UNREAD)
        assert p.requires_grad is not frozen, name
        assert (p.grad is None) is frozen, name
    expert_only = PI05Policy(tiny(train_expert_only=True))
    trainable = {n for n, p in expert_only.named_parameters() if p.requires_grad}
    assert trainable and not any(".paligemma." in n for n in trainable)
    assert {"model.time_mlp_in.weight", EXPERT + "norm.dense.weight"} <= trainable


def test_default_lora_targets_are_lerobots():
    from lerobot_cli.peft.adapters import default_target_modules
    from peft import LoraConfig, get_peft_model

    # LeRobot 0.6.1's PI05Policy._get_default_peft_targets, verbatim (it kept pi0's names).
    lerobot = (
        r"(.*\.gemma_expert\..*\.self_attn\.(q|v)_proj|model\.(state_proj|action_in_proj|action_out_proj|"
        r"action_time_mlp_in|action_time_mlp_out))"
    )
    policy = PI05Policy(tiny())
    assert default_target_modules(policy.config) == lerobot
    model = get_peft_model(policy, LoraConfig(r=2, target_modules=lerobot))
    adapted = {
        n.removesuffix(".lora_A.default.weight").removeprefix("base_model.model.")
        for n, _ in model.named_parameters()
        if n.endswith(".lora_A.default.weight")
    }
    assert adapted == {
        "model.action_in_proj",
        "model.action_out_proj",
        *(f"{EXPERT}layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in ("q", "v")),
    }


def test_config_json_is_lerobots_when_only_lerobot_settings_are_used():
    data = policy_config_to_dict(PI05Config(**FEATURES))
    assert data["type"] == "pi05" and "vision_variant" not in data and "tokenizer_name" not in data
    assert set(data) - {"type"} <= set(LEROBOT_PI05_FIELDS)
    assert set(LEROBOT_PI05_FIELDS) == set(data) - {"type"}
    assert data["tokenizer_max_length"] == 200 and data["paligemma_variant"] == "gemma_2b"
    assert data["normalization_mapping"] == {
        "VISUAL": "IDENTITY",
        "STATE": "QUANTILES",
        "ACTION": "QUANTILES",
    }
    # Everything else is pi0's default (LeRobot's PI05Config differs from its PI0Config in those two only).
    pi0 = policy_config_to_dict(PI0Config(**FEATURES))
    assert {k for k in data if data[k] != pi0[k]} == {"type", "tokenizer_max_length", "normalization_mapping"}
    # Our settings go to config_extensions.json, whatever their values: config.json stays LeRobot's.
    ours, extensions = policy_config_to_dict(tiny()), policy_config_extensions(tiny())
    assert "vision_variant" not in ours and extensions["vision_variant"] == "tiny"
    assert policy_config_from_dict(json.loads(json.dumps({**ours, **extensions}))) == tiny()


def test_registered_with_pi05s_processors():
    assert "pi05" in registry.available()
    config = registry.config_class("pi05")(**TINY, **FEATURES)
    assert type(config) is PI05Config and registry.policy_class(config) is PI05Policy
    from lerobot_cli.processors.factory import make_pre_post_processors

    stats = {
        k: {s: torch.zeros(6) if s.startswith("q0") else torch.ones(6) for s in ("q01", "q99")}
        for k in ("observation.state", "action")
    }
    pre, _ = make_pre_post_processors(config, stats)
    names = [type(step).registry_name for step in pre.steps]
    assert (
        names.index("normalizer_processor")
        < names.index("pi05_prepare_state_tokenizer_processor_step")
        < names.index("tokenizer_processor")
    )
