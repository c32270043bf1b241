"""ACTConfig: LeRobot's fields and defaults, validation that names the flag, presets, no torch import."""

from __future__ import annotations

import subprocess
import sys

import attrs
import pytest
from lerobot_cli.features import NormalizationMode, PolicyFeature
from lerobot_cli.policies import config_class
from lerobot_cli.policies.act.config import ACTConfig

# LeRobot 0.6.1's ACTConfig defaults (pretrained_backbone_weights differs on purpose: we never download).
LEROBOT_DEFAULTS = {
    "n_obs_steps": 1,
    "chunk_size": 100,
    "n_action_steps": 100,
    "vision_backbone": "resnet18",
    "replace_final_stride_with_dilation": False,
    "pre_norm": False,
    "dim_model": 512,
    "n_heads": 8,
    "dim_feedforward": 3200,
    "feedforward_activation": "relu",
    "n_encoder_layers": 4,
    "n_decoder_layers": 1,
    "use_vae": True,
    "latent_dim": 32,
    "n_vae_encoder_layers": 4,
    "temporal_ensemble_coeff": None,
    "dropout": 0.1,
    "kl_weight": 10.0,
    "optimizer_lr": 1e-5,
    "optimizer_weight_decay": 1e-4,
    "optimizer_lr_backbone": 1e-5,
}


def test_defaults_equal_lerobot_backbone_weights_included():
    cfg = ACTConfig()
    assert {k: getattr(cfg, k) for k in LEROBOT_DEFAULTS} == LEROBOT_DEFAULTS
    assert cfg.pretrained_backbone_weights == "ResNet18_Weights.IMAGENET1K_V1"  # LeRobot's ImageNet default
    assert cfg.normalization_mapping == {
        "VISUAL": NormalizationMode.MEAN_STD,
        "STATE": NormalizationMode.MEAN_STD,
        "ACTION": NormalizationMode.MEAN_STD,
    }


def test_field_set_is_lerobot_base_plus_act_fields():
    # Extra fields would make LeRobot's draccus reject our config.json.
    lerobot_base = {
        "n_obs_steps",
        "normalization_mapping",
        "input_features",
        "output_features",
        "device",
        "use_amp",
        "push_to_hub",
        "repo_id",
        "private",
        "tags",
        "license",
        "pretrained_path",
        "pretrained_revision",
        "use_peft",
    }
    names = {a.name for a in attrs.fields(ACTConfig)}
    assert names == lerobot_base | set(LEROBOT_DEFAULTS) | {"pretrained_backbone_weights"}


def test_registry_resolves_act():
    assert config_class("act") is ACTConfig
    assert ACTConfig.spec.model == "lerobot_cli.policies.act.modeling:ACTPolicy"


def test_presets_and_delta_indices():
    cfg = ACTConfig(chunk_size=7, n_action_steps=3, optimizer_lr=2e-5, optimizer_weight_decay=0.5)
    opt = cfg.optimizer_preset()
    assert (opt.type, opt.lr, opt.weight_decay, opt.grad_clip_norm) == ("adamw", 2e-5, 0.5, 10.0)
    assert cfg.scheduler_preset() is None
    assert cfg.action_delta_indices == list(range(7))
    assert cfg.observation_delta_indices is None


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"n_action_steps": 101}, "--policy.n_action_steps"),
        ({"temporal_ensemble_coeff": 0.01}, "--policy.n_action_steps"),
        ({"n_obs_steps": 2}, "--policy.n_obs_steps"),
        ({"vision_backbone": "vit_b_16"}, "--policy.vision_backbone"),
        ({"replace_final_stride_with_dilation": True}, "--policy.replace_final_stride_with_dilation"),
        ({"feedforward_activation": "swish"}, "--policy.feedforward_activation"),
        ({"dim_model": 30, "n_heads": 4}, "--policy.dim_model"),
        ({"dim_model": 6, "n_heads": 2}, "--policy.dim_model"),
        ({"chunk_size": 0, "n_action_steps": 0}, "--policy.chunk_size"),
        ({"dropout": 1.0}, "--policy.dropout"),
        ({"kl_weight": -1.0}, "--policy.kl_weight"),
    ],
)
def test_invalid_values_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag.replace(".", r"\.")):
        ACTConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "neighbour"),
    [  # each accepted edge, and the step just past it that is refused
        (
            {"temporal_ensemble_coeff": 0.01, "n_action_steps": 1},
            {"temporal_ensemble_coeff": 0.01, "n_action_steps": 2},
        ),
        (
            {"vision_backbone": "resnet50", "replace_final_stride_with_dilation": True},
            {"vision_backbone": "resnet18", "replace_final_stride_with_dilation": True},
        ),
        ({"use_vae": False, "n_vae_encoder_layers": 0}, {"use_vae": True, "n_vae_encoder_layers": 0}),
        ({"n_action_steps": 100}, {"n_action_steps": 101}),
    ],
)
def test_valid_edge_cases_are_kept_as_given_and_their_neighbours_refused(kwargs, neighbour):
    cfg = ACTConfig(**kwargs)
    assert all(getattr(cfg, k) == v for k, v in kwargs.items())
    with pytest.raises(ValueError, match=r"--policy\."):
        ACTConfig(**neighbour)


def test_validate_features_needs_camera_or_env_and_action():
    state = {"observation.state": PolicyFeature("STATE", (4,))}
    action = {"action": PolicyFeature("ACTION", (2,))}
    with pytest.raises(ValueError, match="camera"):
        ACTConfig(input_features=state, output_features=action).validate_features()
    with pytest.raises(ValueError, match="action"):
        ACTConfig(
            input_features={"observation.environment_state": PolicyFeature("ENV", (3,))}
        ).validate_features()
    ACTConfig(
        input_features={**state, "observation.images.top": PolicyFeature("VISUAL", (3, 8, 8))},
        output_features=action,
    ).validate_features()


def test_config_modules_do_not_import_torch():
    code = (
        "import sys; import lerobot_cli.policies.act, lerobot_cli.policies.act.config, "
        "lerobot_cli.policies.serialization, lerobot_cli.policies.mlp.config; "
        "from lerobot_cli.policies import config_class; config_class('act'); config_class('mlp'); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
