"""Config (un)structuring: LeRobot's config.json shape, polymorphism by "type", unknown keys tolerated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import cattrs
import pytest
from attrs import define
from lerobot_cli.features import FeatureType, NormalizationMode, PolicyFeature
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.mlp.config import MLPConfig
from lerobot_cli.policies.serialization import (
    UnknownConfigKeysWarning,
    configure_converter,
    load_policy_config,
    policy_config_from_dict,
    policy_config_to_dict,
    save_policy_config,
)

LEROBOT_DIR = Path(__file__).parent / "data" / "lerobot_act_env"


def _act() -> ACTConfig:
    return ACTConfig(
        input_features={
            "observation.state": PolicyFeature(FeatureType.STATE, (4,)),
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 32, 32)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (2,))},
        chunk_size=5,
        n_action_steps=3,
        normalization_mapping={"STATE": NormalizationMode.MIN_MAX},
        tags=["a"],
        temporal_ensemble_coeff=None,
        pretrained_backbone_weights=None,
    )


def test_unstructure_is_lerobot_shaped_with_type_first():
    data = policy_config_to_dict(_act())
    assert next(iter(data)) == "type" and data["type"] == "act"
    assert data["input_features"]["observation.images.top"] == {"type": "VISUAL", "shape": [3, 32, 32]}
    assert data["normalization_mapping"] == {"STATE": "MIN_MAX"}
    assert data["chunk_size"] == 5 and data["pretrained_backbone_weights"] is None
    json.dumps(data)  # plain JSON types only


def test_round_trip_through_base_class_picks_the_subclass():
    for cfg in (_act(), MLPConfig(hidden_dim=8)):
        back = policy_config_from_dict(json.loads(json.dumps(policy_config_to_dict(cfg))))
        assert type(back) is type(cfg) and back == cfg


def test_file_round_trip(tmp_path):
    path = save_policy_config(_act(), tmp_path)
    assert path == tmp_path / "config.json"
    assert load_policy_config(tmp_path) == _act() == load_policy_config(path)


def test_lerobot_written_config_loads_and_warns_about_unknown_keys():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownConfigKeysWarning)  # LeRobot 0.6.1's keys are all ours
        cfg = load_policy_config(LEROBOT_DIR)
    data = {**policy_config_to_dict(cfg), "a_future_lerobot_field": 1}
    with pytest.warns(UnknownConfigKeysWarning, match="a_future_lerobot_field"):
        assert policy_config_from_dict(data) == cfg
    assert isinstance(cfg, ACTConfig)
    assert cfg.input_features["observation.environment_state"] == PolicyFeature(FeatureType.ENV, (3,))
    assert cfg.output_features["action"].shape == (2,)
    assert (cfg.chunk_size, cfg.dim_model, cfg.n_heads, cfg.latent_dim) == (5, 32, 4, 8)


def test_validation_errors_surface_unwrapped():
    data = policy_config_to_dict(ACTConfig())
    data["n_action_steps"] = 1000
    with pytest.raises(ValueError, match=r"--policy\.n_action_steps"):
        policy_config_from_dict(data)


def test_missing_or_unknown_type_and_type_mismatch():
    with pytest.raises(ValueError, match="'type'"):
        policy_config_from_dict({"chunk_size": 5})
    with pytest.raises(ValueError, match="invalid choice 'nope'"):
        policy_config_from_dict({"type": "nope"})
    with pytest.raises(ValueError, match="expects 'act'"):
        policy_config_from_dict({"type": "mlp"}, ACTConfig)


def test_bad_feature_shape_is_reported():
    data = policy_config_to_dict(_act())
    data["input_features"]["observation.state"] = [4]
    with pytest.raises(ValueError, match="policy feature"):
        policy_config_from_dict(data)


def test_configure_converter_serves_a_parent_config_with_optional_policy():
    @define(frozen=True)
    class Outer:
        policy: Optional[PolicyConfig] = None  # noqa: UP045 - the shape TrainConfig uses
        steps: int = 1

    conv = configure_converter(cattrs.Converter())
    outer = Outer(policy=_act(), steps=3)
    data = conv.unstructure(outer)
    assert data["policy"]["type"] == "act"
    assert conv.structure(json.loads(json.dumps(data)), Outer) == outer
    assert conv.structure({"policy": None, "steps": 2}, Outer) == Outer(None, 2)
