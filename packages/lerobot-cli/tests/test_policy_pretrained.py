"""save_pretrained / load_pretrained: LeRobot's files, identical outputs after reload, shared tensors."""

from __future__ import annotations

import json

import pytest
import torch
from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.act.modeling import ACTPolicy
from lerobot_cli.policies.mlp.config import MLPConfig
from lerobot_cli.policies.pretrained import (
    build_policy,
    dedupe_shared_tensors,
    load_pretrained,
    load_weights,
    save_pretrained,
    save_state_dict,
)
from safetensors import safe_open
from torch import nn


def _act_config(**overrides) -> ACTConfig:
    return ACTConfig(
        input_features={
            "observation.state": PolicyFeature("STATE", (4,)),
            "observation.images.top": PolicyFeature("VISUAL", (3, 32, 32)),
        },
        output_features={"action": PolicyFeature("ACTION", (2,))},
        chunk_size=4,
        n_action_steps=4,
        dim_model=16,
        n_heads=2,
        dim_feedforward=32,
        n_encoder_layers=1,
        n_decoder_layers=1,
        n_vae_encoder_layers=1,
        latent_dim=4,
        **{"pretrained_backbone_weights": None, **overrides},
    )


def _obs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.state": torch.randn(2, 4, generator=g),
        "observation.images.top": torch.rand(2, 3, 32, 32, generator=g),
    }


def test_act_round_trip_gives_identical_outputs(tmp_path):
    torch.manual_seed(0)
    cfg = _act_config()
    policy = build_policy(cfg)
    with torch.no_grad():  # non-trivial frozen BN statistics must survive the trip as well
        policy.model.backbone.bn1.running_mean.normal_()
    expected = policy.predict_action_chunk(_obs())

    save_pretrained(policy, cfg, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded_cfg, loaded = load_pretrained(tmp_path)
    assert loaded_cfg == cfg and isinstance(loaded, ACTPolicy) and not loaded.training
    torch.testing.assert_close(loaded.predict_action_chunk(_obs()), expected, rtol=0, atol=0)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(policy.state_dict())
        assert f.metadata() == {"format": "pt"}


def test_config_json_is_lerobot_shaped_and_drops_the_init_file(tmp_path):
    weights = tmp_path / "init.pth"
    torch.save(ACTPolicy(_act_config()).model.backbone.state_dict(), weights)
    cfg = _act_config(pretrained_backbone_weights=str(weights))
    policy = build_policy(cfg)
    save_pretrained(policy, cfg, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "config.json").read_text())
    assert next(iter(data)) == "type" and data["type"] == "act"
    assert data["input_features"]["observation.state"] == {"type": "STATE", "shape": [4]}
    assert data["output_features"] == {"action": {"type": "ACTION", "shape": [2]}}
    assert data["normalization_mapping"]["VISUAL"] == "MEAN_STD"
    assert data["pretrained_backbone_weights"] is None  # weights live in model.safetensors
    weights.unlink()  # loading must not need the init file
    loaded_cfg, _ = load_pretrained(tmp_path / "out")
    assert loaded_cfg.pretrained_backbone_weights is None


def test_state_dict_argument_replaces_the_module(tmp_path):
    cfg = MLPConfig(
        input_features={"observation.state": PolicyFeature("STATE", (3,))},
        output_features={"action": PolicyFeature("ACTION", (2,))},
    )
    policy = build_policy(cfg)
    state = {k: torch.full_like(v, 0.5) for k, v in policy.state_dict().items()}
    save_pretrained(None, cfg, tmp_path, state_dict=state)
    _, loaded = load_pretrained(tmp_path)
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(3, 3, bias=False)
        self.head = nn.Linear(3, 3, bias=False)
        self.head.weight = self.embed.weight


def test_shared_tensors_are_stored_once_and_retied(tmp_path):
    src = _Tied()
    deduped = dedupe_shared_tensors(src.state_dict())
    assert list(deduped) == ["embed.weight"]
    save_state_dict(src.state_dict(), tmp_path / "m.safetensors")
    dst = _Tied()
    load_weights(dst, tmp_path / "m.safetensors")  # head.weight missing from file but tied: fine
    assert torch.equal(dst.head.weight, src.embed.weight)


def test_partially_overlapping_views_get_their_own_copy():
    base = torch.arange(6.0)
    out = dedupe_shared_tensors({"a": base[:4], "b": base[2:]})
    assert set(out) == {"a", "b"}
    assert out["a"].untyped_storage().data_ptr() != out["b"].untyped_storage().data_ptr()


def test_mismatched_weights_fail_clearly(tmp_path):
    cfg = MLPConfig(
        input_features={"observation.state": PolicyFeature("STATE", (3,))},
        output_features={"action": PolicyFeature("ACTION", (2,))},
    )
    save_pretrained(build_policy(cfg), cfg, tmp_path)
    other = MLPConfig(input_features=cfg.input_features, output_features=cfg.output_features, n_blocks=3)
    with pytest.raises(ValueError, match="does not match the model .*: 4 missing from the checkpoint"):
        load_pretrained(tmp_path, config=other)
    with pytest.raises(FileNotFoundError, match="no policy config"):
        load_pretrained(tmp_path / "nowhere")
