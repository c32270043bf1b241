"""SmolVLA: LeRobot's counts and shapes at full size (meta device), the tiny model's training and inference
paths (the prefix cache, action_is_pad, cameras), freezing, save/reload, the processors, a short training
run on the demo dataset, and the config's refusals.

The full size reads SmolVLM2-500M-Video-Instruct's config.json from
data/smolvlm2_500m_video_instruct_config.json (its ``_source`` names where the values come from); the
tiny SmolVLM is smolvlm_tiny.py's, written per session. tools/interop/smolvla_lerobot_interop.py compares
the same model with LeRobot's, bit for bit.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.common.masks import attention_mask_2d
from lerobot_cli.policies.smolvla.config import SmolVLAConfig
from lerobot_cli.policies.smolvla.modeling import SmolVLAPolicy

HERE = Path(__file__).resolve().parent
DEMO = HERE.parents[2] / "data" / "lerobot" / "demo_reach"
FULL_CONFIG = HERE / "data" / "smolvlm2_500m_video_instruct_config.json"
PREFIX = "model.vlm_with_expert."
FEATURES = {
    "input_features": {
        "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 48, 64)),
        "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
    },
    "output_features": {"action": PolicyFeature(FeatureType.ACTION, (6,))},
}
TINY = {"num_vlm_layers": 4, "chunk_size": 4, "n_action_steps": 4, "resize_imgs_with_padding": (32, 32)}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory) -> Path:
    return _load("smolvlm_tiny").save_tiny_smolvlm(tmp_path_factory.mktemp("tiny_smolvlm"))


@pytest.fixture(scope="module")
def full_vlm(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("smolvlm2_500m")
    config = json.loads(FULL_CONFIG.read_text())
    config.pop("_source")
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def tiny(vlm: Path, **overrides) -> SmolVLAConfig:
    return SmolVLAConfig(**{**FEATURES, **TINY, "vlm_model_name": str(vlm), **overrides})


def batch(batch_size: int = 3, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([8, 5, 1, 8][:batch_size])
    return {
        "observation.images.top": torch.rand(batch_size, 3, 48, 64, generator=g),
        "observation.state": torch.randn(batch_size, 6, generator=g),
        "action": torch.randn(batch_size, 4, 6, generator=g),
        "observation.language.tokens": torch.randint(0, 260, (batch_size, 8), generator=g),
        "observation.language.attention_mask": torch.arange(8)[None] < lengths[:, None],
    }


def test_full_size_has_lerobots_counts_and_shapes(full_vlm):
    with torch.device("meta"):
        policy = SmolVLAPolicy(SmolVLAConfig(**FEATURES, vlm_model_name=str(full_vlm)))
    sd = policy.state_dict()
    # LeRobot 0.6.1 (transformers 5.5) on the meta device, tools/interop/smolvla_lerobot_interop.py: 500 keys,
    # 450,046,176 values (lm_head included), 99,880,992 trainable under the defaults (the expert and the
    # projections: train_expert_only and freeze_vision_encoder are on).
    assert len(sd) == 500
    assert sum(v.numel() for v in sd.values()) == 450_046_176
    assert sum(p.numel() for p in policy.parameters() if p.requires_grad) == 99_880_992
    # The text_config's torch_dtype (bfloat16) builds the VLM's text model and the expert (a copy of that
    # config) in bf16, as in LeRobot; the vision tower, connector, lm_head, the expert's replaced
    # cross-attention k/v projections and the flow projections are fresh fp32 modules.
    dtypes = {k: v.dtype for k, v in sd.items()}
    assert sum(d == torch.bfloat16 for d in dtypes.values()) == 275
    bf16 = [k for k, d in dtypes.items() if d == torch.bfloat16]
    assert all(k.startswith((PREFIX + "vlm.model.text_model.", PREFIX + "lm_expert.")) for k in bf16)
    assert dtypes[PREFIX + "lm_expert.layers.1.self_attn.k_proj.weight"] == torch.float32
    assert dtypes[PREFIX + "lm_expert.layers.0.self_attn.k_proj.weight"] == torch.bfloat16
    assert dtypes[PREFIX + "vlm.lm_head.weight"] == torch.float32
    vlm, expert = PREFIX + "vlm.", PREFIX + "lm_expert."
    expected = {
        vlm + "model.vision_model.embeddings.patch_embedding.weight": (768, 3, 16, 16),
        vlm + "model.vision_model.embeddings.position_embedding.weight": (1024, 768),
        vlm + "model.connector.modality_projection.proj.weight": (960, 768 * 16),
        vlm + "model.text_model.embed_tokens.weight": (49280, 960),
        vlm + "model.text_model.layers.15.mlp.gate_proj.weight": (2560, 960),
        vlm + "lm_head.weight": (49280, 960),
        expert + "layers.0.self_attn.q_proj.weight": (960, 720),
        expert + "layers.0.self_attn.k_proj.weight": (320, 720),  # self-attention: reads the expert
        expert + "layers.1.self_attn.k_proj.weight": (320, 320),  # cross-attention: reads the VLM's keys
        expert + "layers.1.self_attn.v_proj.weight": (320, 320),
        expert + "layers.15.mlp.gate_proj.weight": (2048, 720),
        expert + "norm.weight": (720,),
        "model.state_proj.weight": (960, 32),
        "model.action_in_proj.weight": (720, 32),
        "model.action_out_proj.weight": (32, 720),
        "model.action_time_mlp_in.weight": (720, 1440),
        "model.action_time_mlp_out.weight": (720, 720),
    }
    assert {k: tuple(sd[k].shape) for k in expected} == expected
    assert vlm + "model.text_model.layers.16.mlp.gate_proj.weight" not in sd  # cut to num_vlm_layers
    assert expert + "embed_tokens.weight" not in sd


def test_tiny_trains_only_the_expert_and_projections_and_predicts_chunks(tiny_vlm):
    torch.manual_seed(0)
    policy = SmolVLAPolicy(tiny(tiny_vlm))
    policy.train()
    assert not policy.model.vlm_with_expert.vlm.training  # train_expert_only keeps the VLM in eval mode
    loss, _ = policy(batch())
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    with_grad = {n for n, p in policy.named_parameters() if p.grad is not None}
    assert with_grad == {n for n, p in policy.named_parameters() if p.requires_grad}
    assert all(n.startswith((PREFIX + "lm_expert.", "model.state_proj", "model.action")) for n in with_grad)
    assert any(n.startswith("model.state_proj") for n in with_grad)
    chunk = policy.predict_action_chunk(batch())
    assert chunk.shape == (3, 4, 6) and torch.isfinite(chunk).all()
    policy.reset()
    first = policy.select_action(batch())
    assert first.shape == (3, 6) and len(policy._action_queue) == 3


def test_a_bf16_text_config_builds_the_text_model_and_expert_in_bf16_and_trains(tmp_path):
    """SmolVLM2's text_config says torch_dtype bfloat16: LeRobot's towers come out in bf16 from it (the
    replaced cross-attention k/v projections and the flow projections fp32) and train as they are."""
    vlm = _load("smolvlm_tiny").save_tiny_smolvlm(tmp_path / "vlm", text_dtype="bfloat16")
    torch.manual_seed(0)
    policy = SmolVLAPolicy(tiny(vlm)).train()
    params = dict(policy.named_parameters())
    assert params[PREFIX + "lm_expert.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert params[PREFIX + "lm_expert.layers.1.self_attn.k_proj.weight"].dtype == torch.float32
    assert params[PREFIX + "vlm.model.text_model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert params[PREFIX + "vlm.model.vision_model.post_layernorm.weight"].dtype == torch.float32
    loss, _ = policy(batch())
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    grad = params[PREFIX + "lm_expert.layers.0.self_attn.q_proj.weight"].grad
    assert grad is not None and grad.dtype == torch.bfloat16 and torch.isfinite(grad).all()
    assert torch.isfinite(policy.predict_action_chunk(batch())).all()


def test_training_the_vlm_freezes_what_lerobot_freezes(tiny_vlm):
    policy = SmolVLAPolicy(
        tiny(tiny_vlm, train_expert_only=False, freeze_vision_encoder=False, train_state_proj=False)
    )
    frozen = {n for n, p in policy.named_parameters() if not p.requires_grad}
    vlm = PREFIX + "vlm."
    unread = (vlm + "lm_head", vlm + "model.text_model.norm", vlm + "model.text_model.layers.3.")
    assert all(n.startswith((*unread, "model.state_proj")) for n in frozen), frozen
    assert vlm + "lm_head.weight" in frozen and "model.state_proj.weight" in frozen
    assert vlm + "model.vision_model.embeddings.patch_embedding.weight" not in frozen


def test_padded_steps_do_not_count_in_the_loss(tiny_vlm):
    torch.manual_seed(0)
    policy = SmolVLAPolicy(tiny(tiny_vlm)).train()
    b = batch()
    b["action_is_pad"] = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 1]], dtype=torch.bool)
    noise, time = torch.randn(3, 4, 32), torch.rand(3)
    loss, _ = policy(b, noise=noise, time=time)
    # LeRobot's mean: padded steps count zero and are left out of the denominator
    with torch.no_grad():
        images, masks = policy._images(b)
        tokens, token_masks = policy._language(b)
        actions = torch.nn.functional.pad(b["action"], (0, 26))
        losses = policy.model(images, masks, tokens, token_masks, policy._state(b), actions, noise, time)
    valid = ~b["action_is_pad"]
    expected = (losses[:, :, :6] * valid[..., None]).sum() / (valid.sum() * 6)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    assert not torch.allclose(loss, losses[:, :, :6].mean())
    # a padded step's action changes nothing
    b2 = {**b, "action": b["action"].clone()}
    b2["action"][1, 2:] += 100.0
    assert torch.equal(policy(b2, noise=noise, time=time)[0], loss)


def test_cached_denoising_equals_the_training_forward(tiny_vlm):
    """A denoising step over the prefix cache gives the velocity the training pass computes at that time."""
    torch.manual_seed(0)
    policy = SmolVLAPolicy(tiny(tiny_vlm)).eval()
    model, b = policy.model, batch()
    images, masks = policy._images(b)
    tokens, token_masks = policy._language(b)
    state = policy._state(b)
    x_t, time = torch.randn(3, 4, 32), torch.tensor([0.9, 0.5, 0.2])
    with torch.no_grad():
        prefix, prefix_pad, prefix_att = model.embed_prefix(images, masks, tokens, token_masks, state)
        mask = attention_mask_2d(prefix_pad, prefix_att)
        positions = torch.cumsum(prefix_pad, dim=1) - 1
        _, cache = model.vlm_with_expert.run([prefix, None], mask, positions, fill_cache=True)
        cached = model.denoise_step(prefix_pad, cache, x_t, time)
        suffix, suffix_pad, suffix_att = model.embed_suffix(x_t, time)
        pad = torch.cat([prefix_pad, suffix_pad], dim=1)
        full_mask = attention_mask_2d(pad, torch.cat([prefix_att, suffix_att], dim=1))
        (_, out), _ = model.vlm_with_expert.run([prefix, suffix], full_mask, torch.cumsum(pad, dim=1) - 1)
        direct = model.action_out_proj(out[:, -4:])
    torch.testing.assert_close(cached, direct, rtol=1e-5, atol=1e-5)


def test_cameras_are_resized_with_left_top_padding_and_missing_ones_blank(tiny_vlm):
    two = {
        **FEATURES["input_features"],
        "observation.images.side": PolicyFeature(FeatureType.VISUAL, (3, 48, 64)),
    }
    policy = SmolVLAPolicy(tiny(tiny_vlm, input_features=two, empty_cameras=1))
    b = batch()
    b["observation.images.top"] = torch.ones(3, 3, 48, 64)
    images, masks = policy._images(b)  # the side camera is missing: one blank, masked image for it
    assert len(images) == 2 and images[0].shape == (3, 3, 32, 32)
    # 48x64 -> 24x32, padded with 0 (-1 after scaling) on the top 8 rows, nothing on the left
    assert torch.equal(images[0][:, :, :8], torch.full((3, 3, 8, 32), -1.0))
    assert torch.equal(images[0][:, :, 8:], torch.ones(3, 3, 24, 32))
    assert torch.equal(images[1], torch.full_like(images[0], -1.0)) and not masks[1].any() and masks[0].all()
    # without empty_cameras a missing camera is left out, as LeRobot does
    images, _ = SmolVLAPolicy(tiny(tiny_vlm, input_features=two))._images(b)
    assert len(images) == 1


def test_saved_policy_reloads_with_equal_outputs(tiny_vlm, tmp_path):
    from lerobot_cli.policies.weights import load_policy, save_pretrained

    torch.manual_seed(0)
    policy = SmolVLAPolicy(tiny(tiny_vlm))
    save_pretrained(policy, policy.config, tmp_path / "pretrained_model")
    saved = json.loads((tmp_path / "pretrained_model" / "config.json").read_text())
    assert saved["type"] == "smolvla" and saved["vlm_model_name"] == str(tiny_vlm)
    assert not (tmp_path / "pretrained_model" / "config_extensions.json").exists()
    config, loaded = load_policy(tmp_path / "pretrained_model")
    assert config == policy.config
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in policy.state_dict().items())
    noise = torch.randn(3, 4, 32)
    torch.testing.assert_close(
        loaded.predict_action_chunk(batch(), noise=noise), policy.predict_action_chunk(batch(), noise=noise)
    )


def test_processors_are_lerobots_steps(tiny_vlm, tmp_path):
    from lerobot_cli.processors.factory import make_pre_post_processors

    config = tiny(tiny_vlm, tokenizer_max_length=16)
    stats = {
        "observation.state": {"mean": torch.zeros(6), "std": torch.ones(6)},
        "action": {"mean": torch.zeros(6), "std": torch.ones(6)},
    }
    pre, post = make_pre_post_processors(config, stats)
    assert [s.registry_name for s in pre.steps] == [
        "rename_observations_processor",
        "to_batch_processor",
        "smolvla_new_line_processor",
        "tokenizer_processor",
        "device_processor",
        "normalizer_processor",
    ]
    assert [s.registry_name for s in post.steps] == ["unnormalizer_processor", "device_processor"]
    tokenizer = pre.steps[3]
    assert (tokenizer.tokenizer_name, tokenizer.padding, tokenizer.padding_side, tokenizer.max_length) == (
        str(tiny_vlm),
        "longest",
        "right",
        16,
    )
    out = pre(
        {
            "observation.state": torch.zeros(2, 6),
            "observation.images.top": torch.rand(2, 3, 48, 64),
            "task": ["go", "reach the red target"],
        }
    )
    assert out["task"] == ["go\n", "reach the red target\n"]
    # longest padding: as long as the longest prompt (bos + 21 bytes), not max_length
    assert out["observation.language.tokens"].shape == (2, 16)
    assert out["observation.language.attention_mask"].sum(1).tolist() == [4, 16]
    pre.save_pretrained(tmp_path)
    assert (tmp_path / "policy_preprocessor_step_5_normalizer_processor.safetensors").is_file()


def test_a_tiny_smolvla_trains_on_the_demo_dataset(tiny_vlm, tmp_path, monkeypatch, capsys):
    from lerobot_cli.train import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "demo_smolvla"
    argv = [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--policy.type=smolvla",
        f"--policy.vlm_model_name={tiny_vlm}",
        "--policy.num_vlm_layers=4",
        "--policy.chunk_size=4",
        "--policy.n_action_steps=4",
        "--policy.resize_imgs_with_padding=[32,32]",
        "--steps=4",
        "--batch_size=4",
        "--log_freq=2",
        "--save_freq=4",
        "--num_workers=0",
        f"--output_dir={out}",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Policy: smolvla; learnable params" in printed, printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(row["loss"] > 0 for row in rows)
    saved = out / "checkpoints" / "last" / "pretrained_model"
    assert json.loads((saved / "config.json").read_text())["type"] == "smolvla"
    steps = json.loads((saved / "policy_preprocessor.json").read_text())["steps"]
    assert [s["registry_name"] for s in steps][2:4] == ["smolvla_new_line_processor", "tokenizer_processor"]
    from lerobot_cli.policies.weights import load_policy

    _, policy = load_policy(saved)
    chunk = policy.predict_action_chunk(
        {
            "observation.images.top": torch.rand(1, 3, 64, 64),
            "observation.state": torch.zeros(1, 2),
            "observation.language.tokens": torch.tensor([[2, 77, 111]]),
            "observation.language.attention_mask": torch.ones(1, 3, dtype=torch.bool),
        }
    )
    assert chunk.shape == (1, 4, 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_action_steps": 60}, "cannot be greater than --policy.chunk_size"),
        ({"add_image_special_tokens": True}, "image special tokens"),
        ({"use_cache": False}, "use_cache=false"),
        ({"use_delta_joint_actions_aloha": True}, "not ported in LeRobot"),
        ({"resize_imgs_with_padding": None}, "resize_imgs_with_padding must be"),
        ({"pad_language_to": "middle"}, "pad_language_to"),
        ({"num_expert_layers": 8}, "VLM layer 2 is a self-attention layer but its expert layer 1"),
        ({"rtc_config": {}}, "rtc_config with enabled=true"),
    ],
)
def test_config_refusals(overrides, message):
    with pytest.raises(ValueError, match=message):
        SmolVLAConfig(**{**FEATURES, **overrides})


def test_a_missing_vlm_names_the_download():
    from lerobot_cli.policies.smolvla.vlm import VLMUnavailableError, vlm_directory

    with pytest.raises(VLMUnavailableError, match="hf download someone/not-a-cached-smolvlm"):
        vlm_directory("someone/not-a-cached-smolvlm")
    (source,) = SmolVLAConfig(**FEATURES).external_sources()
    assert source.flag == "--policy.vlm_model_name"


def test_a_hub_id_is_read_from_the_hugging_face_cache(tiny_vlm, tmp_path, monkeypatch):
    """vlm_model_name as a Hub id: its config.json from the cache's snapshot, never a download."""
    from huggingface_hub import constants
    from lerobot_cli.policies.smolvla.vlm import load_vlm_config, vlm_directory

    repo = tmp_path / "hub" / "models--someone--tiny-smolvlm"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    (snapshot / "config.json").write_text((tiny_vlm / "config.json").read_text())
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert vlm_directory("someone/tiny-smolvlm") == snapshot
    assert load_vlm_config("someone/tiny-smolvlm").text_config.hidden_size == 64
    policy = SmolVLAPolicy(tiny(tiny_vlm, vlm_model_name="someone/tiny-smolvlm"))
    assert policy.model.vlm_with_expert.expert_hidden_size == 48
