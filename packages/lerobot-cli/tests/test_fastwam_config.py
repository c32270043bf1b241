"""FastWAMConfig: LeRobot 0.6.1's fields, defaults and derivations, its validation (one line per rule), the
dataset fit (LeRobot's ``set_dataset_feature_metadata``), the config files and the base-model resolution.
Torch-free: the config layer never imports torch."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from lerobot_cli.errors import ConfigError
from lerobot_cli.features import FeatureType, NormalizationMode, PolicyFeature
from lerobot_cli.policies.dataset_fit import policy_config_for_dataset
from lerobot_cli.policies.fastwam.base import BaseModelUnavailable, resolve_base_model
from lerobot_cli.policies.fastwam.config import FastWAMConfig
from lerobot_cli.policies.fastwam.dit_configs import (
    default_action_dit_config,
    default_video_dit_config,
    tiny_dit_configs,
)
from lerobot_cli.policies.serialization import load_policy_config, policy_config_from_dict, save_policy_config

# dataclasses.fields(lerobot.policies.fastwam.FastWAMConfig) in LeRobot 0.6.1.
LEROBOT_FIELDS = {
    "action_dim",
    "action_dit_config",
    "action_horizon",
    "action_scheduler",
    "action_video_freq_ratio",
    "base_model_id",
    "context_len",
    "device",
    "fp32_attention",
    "freeze_video_expert",
    "image_size",
    "inference_seed",
    "input_features",
    "license",
    "load_text_encoder",
    "loss",
    "model_id",
    "mot_checkpoint_mixed_attn",
    "n_action_steps",
    "n_obs_steps",
    "negative_prompt",
    "normalization_mapping",
    "num_inference_steps",
    "num_video_frames",
    "optimizer_lr",
    "optimizer_weight_decay",
    "output_features",
    "pretrained_path",
    "pretrained_revision",
    "private",
    "prompt_template",
    "proprio_dim",
    "push_to_hub",
    "rand_device",
    "repo_id",
    "sigma_shift",
    "tags",
    "text_cfg_scale",
    "text_encoder_model_id",
    "tiled",
    "toggle_action_dimensions",
    "tokenizer_max_len",
    "tokenizer_model_id",
    "torch_dtype",
    "use_amp",
    "use_gradient_checkpointing",
    "use_peft",
    "video_dit_config",
    "video_scheduler",
}
# LeRobot 0.6.1's defaults of its FastWAM-specific fields.
LEROBOT_DEFAULTS = {
    "action_dim": 7,
    "proprio_dim": 8,
    "action_horizon": 32,
    "n_action_steps": 32,
    "num_video_frames": 33,
    "action_video_freq_ratio": 4,
    "image_size": (224, 448),
    "context_len": 128,
    "model_id": "Wan-AI/Wan2.2-TI2V-5B",
    "tokenizer_model_id": "google/umt5-xxl",
    "text_encoder_model_id": "Wan-AI/Wan2.2-TI2V-5B-Diffusers",
    "base_model_id": "lerobot/fastwam_base",
    "tokenizer_max_len": 128,
    "load_text_encoder": True,
    "mot_checkpoint_mixed_attn": False,
    "torch_dtype": "bfloat16",
    "prompt_template": (
        "A video recorded from a robot's point of view executing the following instruction: {task}"
    ),
    "num_inference_steps": 10,
    "inference_seed": 42,
    "rand_device": "cpu",
    "text_cfg_scale": 1.0,
    "negative_prompt": "",
    "sigma_shift": None,
    "tiled": False,
    "fp32_attention": True,
    "use_gradient_checkpointing": False,
    "freeze_video_expert": False,
    "toggle_action_dimensions": [],
    "video_scheduler": {"train_shift": 5.0, "infer_shift": 5.0, "num_train_timesteps": 1000},
    "action_scheduler": {"train_shift": 5.0, "infer_shift": 5.0, "num_train_timesteps": 1000},
    "loss": {"lambda_video": 1.0, "lambda_action": 1.0},
    "optimizer_lr": 1e-4,
    "optimizer_weight_decay": 1e-2,
    "n_obs_steps": 1,
    "normalization_mapping": {
        "VISUAL": NormalizationMode.IDENTITY,
        "STATE": NormalizationMode.MEAN_STD,
        "ACTION": NormalizationMode.MEAN_STD,
    },
}
DEMO_INFO = Path(__file__).resolve().parents[3] / "data" / "lerobot" / "demo_reach" / "meta" / "info.json"


def tiny(**overrides) -> FastWAMConfig:
    video, action = tiny_dit_configs()
    return FastWAMConfig(video_dit_config=video, action_dit_config=action, **overrides)


def test_fields_are_lerobots_plus_compile_action_infer_precompute_and_variant():
    ours = {a.name for a in attrs.fields(FastWAMConfig)}
    assert ours - LEROBOT_FIELDS == {"compile_action_infer", "precompute_task_contexts", "variant"}
    assert LEROBOT_FIELDS <= ours
    assert FastWAMConfig.spec.extension_fields == (
        "compile_action_infer",
        "precompute_task_contexts",
        "variant",
    )
    assert FastWAMConfig.spec.extras == ("fastwam",)


def test_defaults_and_derivations_are_lerobots():
    cfg = FastWAMConfig()
    assert {k: getattr(cfg, k) for k in LEROBOT_DEFAULTS} == LEROBOT_DEFAULTS
    assert (
        cfg.compile_action_infer is False and cfg.variant == "full" and cfg.precompute_task_contexts is False
    )
    assert cfg.video_dit_config == default_video_dit_config(7) and cfg.video_dit_config["hidden_dim"] == 3072
    assert cfg.action_dit_config == default_action_dit_config(7)
    assert cfg.action_dit_config["hidden_dim"] == 1024
    assert cfg.input_features == {
        "observation.images.image": PolicyFeature(FeatureType.VISUAL, (3, 224, 448)),
        "observation.state": PolicyFeature(FeatureType.STATE, (8,)),
    }
    assert cfg.output_features == {"action": PolicyFeature(FeatureType.ACTION, (7,))}
    assert "observation.state" not in FastWAMConfig(proprio_dim=None).input_features
    assert FastWAMConfig(action_dim=5, proprio_dim=3).video_dit_config["action_dim"] == 5
    assert cfg.model_video_frames == 9
    assert cfg.observation_delta_indices == [0, 4, 8, 12, 16, 20, 24, 28, 32]
    assert cfg.action_delta_indices == list(range(32))
    assert cfg.activation_checkpointing() is None


def test_switches_propagate_into_the_network_configs():
    video, action = tiny_dit_configs()
    video["fp32_attention"] = True
    cfg = FastWAMConfig(
        fp32_attention=False,
        use_gradient_checkpointing=True,
        video_dit_config=video,
        action_dit_config=action,
    )
    for dit in (cfg.video_dit_config, cfg.action_dit_config):
        assert dit["fp32_attention"] is False and dit["use_gradient_checkpointing"] is True
    assert video["fp32_attention"] is True  # the caller's dict is not mutated
    assert cfg.activation_checkpointing() == "--policy.use_gradient_checkpointing"
    empty = FastWAMConfig(video_dit_config={}, action_dit_config={})  # LeRobot: `or default`
    assert empty.video_dit_config == default_video_dit_config(7)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"n_action_steps": 40},
            r"^--policy.n_action_steps \(40\) cannot exceed --policy.action_horizon \(32\)$",
        ),
        (
            {"num_video_frames": 34},
            (
                r"^--policy.num_video_frames - 1 \(33\) must be divisible by "
                r"--policy.action_video_freq_ratio \(4\)$"
            ),
        ),
        ({"num_video_frames": 25}, r"^the video has 7 frames after subsampling; the Wan VAE needs 4k \+ 1"),
        (
            {"action_horizon": 20, "n_action_steps": 20},
            r"^--policy.action_horizon \(20\) must be divisible by the number of video transitions \(8\)$",
        ),
        ({"action_dim": 0}, r"^--policy.action_dim must be an integer ≥ 1, got 0$"),
        (
            {"model_id": "someone/else"},
            r"^--policy.model_id must be Wan-AI/Wan2.2-TI2V-5B or an explicit local path",
        ),
        ({"torch_dtype": "float8"}, r"^--policy.torch_dtype: invalid choice 'float8'"),
        ({"image_size": (224, 450)}, r"^--policy.image_size must be \[height, width\], multiples of 16"),
        ({"n_obs_steps": 2}, r"^--policy.n_obs_steps must be 1 for fastwam"),
        (
            {"toggle_action_dimensions": [7]},
            (
                r"^--policy.toggle_action_dimensions \[7\] are outside the action's 7 dimensions "
                r"\(valid: -7 to 6, negative ones count from the end\)$"
            ),
        ),
        (
            {"toggle_action_dimensions": [-1, -8]},
            r"^--policy.toggle_action_dimensions \[-8\] are outside the action's 7 dimensions",
        ),
        (
            {"loss": {"lambda_video": 1.0}},
            r"^--policy.loss must have the keys lambda_video and lambda_action",
        ),
        ({"video_scheduler": {"train_shift": 5.0}}, r"^--policy.video_scheduler must have the keys"),
    ],
)
def test_settings_are_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=message) as exc:
        FastWAMConfig(**overrides)
    assert "\n" not in str(exc.value)


def test_negative_toggle_dimensions_count_from_the_end_as_in_lerobot(tmp_path, monkeypatch):
    """LeRobot's processor resolves -1 as the last dimension and its config checks nothing, so its
    config.json may say [-1]: accepted, kept as written, and read back from such a file."""
    from lerobot_cli.policies import registry

    monkeypatch.setitem(registry._REGISTERED, "fastwam", FastWAMConfig)
    assert FastWAMConfig(toggle_action_dimensions=[-1, 0, -7]).toggle_action_dimensions == [-1, 0, -7]
    assert FastWAMConfig(action_dim=6, toggle_action_dimensions=[-6]).toggle_action_dimensions == [-6]
    cfg = tiny(toggle_action_dimensions=[-1])
    save_policy_config(cfg, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["toggle_action_dimensions"] == [-1]
    assert load_policy_config(tmp_path).toggle_action_dimensions == [-1]


def _tiny_with(video_change=None, action_change=None, **overrides) -> FastWAMConfig:
    video, action = tiny_dit_configs()
    video.update(video_change or {})
    action.update(action_change or {})
    return FastWAMConfig(video_dit_config=video, action_dit_config=action, **overrides)


@pytest.mark.parametrize(
    ("video", "action", "message"),
    [
        (
            {},
            {"num_heads": 4},
            r"^--policy.action_dit_config.num_heads \(4\) must equal video_dit_config.num_heads \(2\)",
        ),
        ({}, {"num_layers": 3}, r"^--policy.action_dit_config.num_layers \(3\) must equal"),
        (
            {},
            {"text_dim": 16},
            r"^--policy.action_dit_config.text_dim \(16\) must equal video_dit_config.text_dim \(32\)",
        ),
        (
            {},
            {"action_dim": 6},
            r"^--policy.action_dit_config.action_dim \(6\) must equal --policy.action_dim \(7\)$",
        ),
        (
            {"attn_head_dim": 8},
            {"attn_head_dim": 8},
            (
                r"^--policy.video_dit_config: attn_head_dim \(8\) × num_heads \(2\) "
                r"must equal hidden_dim \(32\)"
            ),
        ),
        (
            {"video_attention_mask_mode": "causal"},
            {},
            (
                r"^--policy.video_dit_config.video_attention_mask_mode: invalid "
                r"choice 'causal'"
            ),
        ),
        ({"seperated_timestep": False}, {}, r"^--policy.video_dit_config: seperated_timestep must be true"),
        ({"has_image_input": True}, {}, r"^--policy.video_dit_config: has_image_input=True is not supported"),
        ({"dropout": 0.1}, {}, r"^--policy.video_dit_config has unknown keys dropout"),
        ({}, {"dropout": 0.1}, r"^--policy.action_dit_config has unknown keys dropout"),
    ],
)
def test_network_configs_are_refused_in_one_line(video, action, message):
    with pytest.raises(ValueError, match=message):
        _tiny_with(video, action)
    video_missing, action_missing = tiny_dit_configs()
    del video_missing["ffn_dim"]
    with pytest.raises(ValueError, match=r"^--policy.video_dit_config lacks ffn_dim"):
        FastWAMConfig(video_dit_config=video_missing, action_dit_config=action_missing)


@pytest.mark.parametrize(
    ("video", "image_size", "message"),
    [
        (
            {"in_dim": 16},
            (224, 448),
            (
                r"^--policy.video_dit_config.in_dim is 16, but the video DiT reads the Wan2.2 VAE's "
                r"latents, which have 48 channels: set it to 48$"
            ),
        ),
        (
            {"out_dim": 16},
            (224, 448),
            r"^--policy.video_dit_config.out_dim is 16, but the video DiT predicts the Wan2.2 VAE's latents",
        ),
        (
            {"patch_size": [2, 2, 2]},
            (224, 448),
            (
                r"^--policy.video_dit_config.patch_size \[2, 2, 2\] patches 2 latent frames together; "
                r".* the first entry must be 1$"
            ),
        ),
        (
            {"patch_size": [1, 3, 3]},
            (32, 32),
            (
                r"^--policy.video_dit_config.patch_size \[1, 3, 3\] does not divide the latent image "
                r"2 x 2 \(--policy.image_size \[32, 32\] over the Wan VAE's 16x downsampling\)"
            ),
        ),
        (
            {},
            (224, 432),
            r"^--policy.video_dit_config.patch_size \[1, 2, 2\] does not divide the latent image 14 x 27 ",
        ),
    ],
)
def test_the_video_dit_must_fit_the_vae_latents_before_any_weight(video, image_size, message):
    """Caught in the config, before the VAE or the model is built (they were a ValueError from the frozen
    parts' build, a shape error at the first loss, and the DiT's patch check at the first step)."""
    with pytest.raises(ValueError, match=message) as exc:
        _tiny_with(video, image_size=image_size)
    assert "\n" not in str(exc.value)
    _tiny_with({"patch_size": [1, 1, 1]}, image_size=(16, 48))  # a 1 x 3 latent image: any 1 x 1 patch


def test_the_latent_geometry_the_config_checks_is_the_vaes():
    pytest.importorskip("torch")
    from lerobot_cli.policies.fastwam import config
    from lerobot_cli.policies.fastwam.vae import WAN22_VAE_ARCHITECTURE, tiny_wan_vae_config

    for vae in (WAN22_VAE_ARCHITECTURE, tiny_wan_vae_config()):
        assert vae["z_dim"] == config.WAN_VAE_LATENT_CHANNELS
        assert vae["scale_factor_spatial"] == config.WAN_VAE_SPATIAL_FACTOR


def feature(kind: str, *shape: int) -> PolicyFeature:
    return PolicyFeature(kind, shape)


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (
            {"observation.state": feature("STATE", 8)},
            None,
            r"^fastwam needs a camera \(observation.images.\*\)",
        ),
        (
            None,
            {"action": feature("ACTION", 6)},
            (
                r"^the action has shape \[6\] but --policy.action_dim is 7; pass "
                r"--policy.action_dim=6$"
            ),
        ),
        (
            {"observation.images.a": feature("VISUAL", 3, 224, 448)},
            None,
            (
                r"^--policy.proprio_dim=8 needs observation.state, which the inputs lack; pass "
                r"--policy.proprio_dim=null"
            ),
        ),
        (
            {
                "observation.images.a": feature("VISUAL", 3, 224, 448),
                "observation.state": feature("STATE", 6),
            },
            None,
            r"^observation.state has shape \[6\] but --policy.proprio_dim is 8; pass --policy.proprio_dim=6$",
        ),
        (
            {
                "observation.images.a": feature("VISUAL", 3, 200, 448),
                "observation.state": feature("STATE", 8),
            },
            None,
            r"^fastwam camera observation.images.a is 200 pixels high; --policy.image_size needs 224$",
        ),
        (
            {
                "observation.images.a": feature("VISUAL", 3, 224, 224),
                "observation.state": feature("STATE", 8),
            },
            None,
            r"^fastwam's cameras are 224 pixels wide side by side, but --policy.image_size needs 448",
        ),
    ],
)
def test_features_are_refused_in_one_line(inputs, outputs, message):
    cfg = FastWAMConfig(
        **({"input_features": inputs} if inputs else {}), **({"output_features": outputs} if outputs else {})
    )
    with pytest.raises(ValueError, match=message):
        cfg.validate_features()
    FastWAMConfig().validate_features()  # LeRobot's synthetic default features pass


def dataset_features(cameras: dict[str, tuple[int, int]], state: int | None = 8, action: int = 7) -> dict:
    features = {
        key: {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"]}
        for key, (h, w) in cameras.items()
    }
    if state is not None:
        features["observation.state"] = {"dtype": "float32", "shape": [state]}
    features["action"] = {"dtype": "float32", "shape": [action]}
    features["index"] = {"dtype": "int64", "shape": [1]}
    return features


def test_dataset_cameras_become_the_inputs_sorted_at_their_share_of_the_width():
    features = dataset_features({"observation.images.wrist": (480, 640), "observation.images.top": (96, 128)})
    cfg = policy_config_for_dataset(FastWAMConfig(), features)  # what the CLI and the workload call
    assert cfg.input_features == {
        "observation.images.top": feature("VISUAL", 3, 224, 224),
        "observation.images.wrist": feature("VISUAL", 3, 224, 224),
        "observation.state": feature("STATE", 8),
    }
    assert cfg.output_features == {"action": feature("ACTION", 7)}
    cfg.validate_features()
    assert list(cfg.input_features)[:2] == ["observation.images.top", "observation.images.wrist"]


def test_the_dataset_decides_the_action_and_state_shapes_checked_against_the_flags():
    cfg = policy_config_for_dataset(FastWAMConfig(), json.loads(DEMO_INFO.read_text())["features"])
    assert cfg.input_features["observation.images.top"] == feature("VISUAL", 3, 224, 448)
    assert cfg.input_features["observation.state"] == feature("STATE", 2)  # the dataset's, not proprio_dim's
    assert "observation.environment_state" not in cfg.input_features
    with pytest.raises(ValueError, match=r"^the action has shape \[2\] but --policy.action_dim is 7"):
        cfg.validate_features()
    fitted = policy_config_for_dataset(
        FastWAMConfig(action_dim=2, proprio_dim=2), json.loads(DEMO_INFO.read_text())["features"]
    )
    fitted.validate_features()
    no_state = policy_config_for_dataset(
        FastWAMConfig(action_dim=2, proprio_dim=None), json.loads(DEMO_INFO.read_text())["features"]
    )
    assert set(no_state.input_features) == {"observation.images.top"}
    no_state.validate_features()


def test_a_dataset_without_named_cameras_is_refused_and_three_cameras_need_a_divisible_width():
    """Not named observation.images.*: LeRobot ignores the image, keeps its synthetic camera and fails at
    the first batch (a KeyError); here the dataset is refused in one line at start-up."""
    features = dataset_features({"observation.image": (64, 64)})
    with pytest.raises(
        ConfigError,
        match=r"^fastwam needs a camera, but the dataset has no observation.images.\* feature \(its "
        r"observations: observation.image, observation.state\): .*use a dataset with a camera$",
    ):
        policy_config_for_dataset(FastWAMConfig(), features)
    stacked = {**features, "video": {"dtype": "float32", "shape": [3, 5, 224, 448]}}
    cfg = policy_config_for_dataset(FastWAMConfig(), stacked)  # LeRobot's pre-stacked video: read as is
    assert list(cfg.input_features) == ["observation.images.image", "observation.state"]
    three = dataset_features({f"observation.images.c{i}": (64, 64) for i in range(3)})
    with pytest.raises(
        ValueError,
        match=r"cameras are 447 pixels wide side by side, but "
        r"--policy.image_size needs 448",
    ):
        policy_config_for_dataset(FastWAMConfig(), three).validate_features()
    policy_config_for_dataset(FastWAMConfig(image_size=(224, 480)), three).validate_features()


def test_config_json_holds_lerobots_fields_and_the_sidecar_the_extension(tmp_path):
    cfg = tiny(compile_action_infer=True, proprio_dim=None, fp32_attention=False)
    file = save_policy_config(cfg, tmp_path)
    written = json.loads(file.read_text())
    assert set(written) - {"type"} <= LEROBOT_FIELDS and written["type"] == "fastwam"
    assert written["video_dit_config"]["fp32_attention"] is False
    assert json.loads((tmp_path / "config_extensions.json").read_text()) == {
        "type": "fastwam",
        "compile_action_infer": True,
        "precompute_task_contexts": False,
        "variant": "full",
    }
    assert policy_config_from_dict(written, FastWAMConfig).compile_action_infer is False  # config.json alone
    merged = json.loads(file.read_text()) | {"compile_action_infer": True}
    assert policy_config_from_dict(merged, FastWAMConfig) == cfg


def test_a_saved_config_loads_back_equal(tmp_path, monkeypatch):
    from lerobot_cli.policies import registry

    monkeypatch.setitem(registry._REGISTERED, "fastwam", FastWAMConfig)  # registered for this test only
    cfg = tiny(compile_action_infer=True, freeze_video_expert=True, sigma_shift=3.0, inference_seed=None)
    save_policy_config(cfg, tmp_path)
    assert load_policy_config(tmp_path) == cfg
    # variant=tiny: config.json holds the tiny networks it derived, the sidecar the variant
    small = FastWAMConfig(variant="tiny", action_dim=2, proprio_dim=None)
    assert (small.video_dit_config, small.action_dit_config) == tiny_dit_configs(2)
    save_policy_config(small, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["video_dit_config"]["hidden_dim"] == 32
    assert json.loads((tmp_path / "config_extensions.json").read_text())["variant"] == "tiny"
    assert load_policy_config(tmp_path) == small


def test_base_model_resolution_is_offline_and_one_line(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_base_model(tiny()) is None  # other network sizes: LeRobot loads no base either
    assert resolve_base_model(FastWAMConfig(base_model_id=None)) is None
    assert resolve_base_model(FastWAMConfig(pretrained_path="/some/policy")) is None
    with pytest.raises(BaseModelUnavailable) as exc:
        resolve_base_model(FastWAMConfig())
    message = str(exc.value)
    assert (
        message.startswith(
            "--policy.base_model_id=lerobot/fastwam_base is neither a local directory nor "
            "in the "
            "Hugging Face cache"
        )
        and "hf download lerobot/fastwam_base" in message
    )
    assert "--policy.base_model_id=null" in message and "\n" not in message
    local = tmp_path / "base"
    local.mkdir()
    with pytest.raises(BaseModelUnavailable, match=r"base: no model.safetensors in that directory"):
        resolve_base_model(FastWAMConfig(base_model_id=str(local)))
    (local / "model.safetensors").write_text("")
    assert resolve_base_model(FastWAMConfig(base_model_id=str(local))) == local
    snapshot = tmp_path / "hub" / "models--lerobot--fastwam_base" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--lerobot--fastwam_base" / "refs").mkdir()
    (tmp_path / "hub" / "models--lerobot--fastwam_base" / "refs" / "main").write_text("a" * 40)
    with pytest.raises(BaseModelUnavailable):  # a snapshot without the weights is not the base
        resolve_base_model(FastWAMConfig())
    (snapshot / "model.safetensors").write_text("")
    assert resolve_base_model(FastWAMConfig()) == snapshot
    # written null once the weights are the policy's own
    assert "base_model_id" in FastWAMConfig.spec.init_only_fields


def test_tiny_configs_are_valid_and_small():
    cfg = tiny()
    assert cfg.video_dit_config["hidden_dim"] == 32 and cfg.action_dit_config["hidden_dim"] == 24
    # attention wider than the hidden width, as in the full action DiT
    assert cfg.action_dit_config["num_heads"] * cfg.action_dit_config["attn_head_dim"] != 24
    assert not cfg.fits_base_model() and FastWAMConfig().fits_base_model()


def test_precomputing_task_contexts_needs_the_text_encoder():
    """The contexts are UMT5's: without ``load_text_encoder`` there is nothing to encode them with."""
    assert tiny(precompute_task_contexts=True).load_text_encoder
    with pytest.raises(
        ValueError, match=r"^--policy.precompute_task_contexts=true encodes each task with UMT5"
    ):
        tiny(precompute_task_contexts=True, load_text_encoder=False)


def test_the_dry_run_note_counts_the_frozen_parts_each_rank_holds():
    """Wan2.2's VAE (704,688,668 parameters) and UMT5-XXL (5,680,910,336) counted on the meta device, in
    torch_dtype; with precompute_task_contexts UMT5 is on rank 0 at the start only."""
    from lerobot_cli.policies.fastwam.precompute import frozen_parts_note
    from lerobot_cli.policies.fastwam.text import umt5_parameter_count
    from lerobot_cli.policies.fastwam.vae import wan_vae_parameter_count

    assert umt5_parameter_count() == 5_680_910_336 and wan_vae_parameter_count() == 704_688_668
    assert frozen_parts_note(FastWAMConfig(precompute_task_contexts=True)) == (
        "Frozen, outside the plan, on every rank: the Wan2.2 VAE 1.31 GiB; UMT5 (10.58 GiB) only on rank 0 "
        "at the start, to encode each task once: every rank then holds 1.00 MiB of context per task "
        "(--policy.precompute_task_contexts=true)"
    )
    assert frozen_parts_note(FastWAMConfig(load_text_encoder=False, torch_dtype="float32")) == (
        "Frozen, outside the plan, on every rank: the Wan2.2 VAE 2.63 GiB (no text encoder: the batches "
        "carry contexts)"
    )
