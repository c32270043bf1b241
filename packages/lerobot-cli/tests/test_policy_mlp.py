"""MLPPolicy: learns a tiny synthetic task, deterministic without dropout, same protocol as ACT."""

from __future__ import annotations

import pytest
import torch
from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies import policy_class
from lerobot_cli.policies.mlp.config import MLPConfig
from lerobot_cli.policies.mlp.modeling import MLPBlock, MLPPolicy


def _config(**overrides) -> MLPConfig:
    return MLPConfig(
        input_features={
            "observation.state": PolicyFeature("STATE", (4,)),
            "observation.environment_state": PolicyFeature("ENV", (2,)),
            "observation.images.top": PolicyFeature("VISUAL", (3, 8, 8)),
        },
        output_features={"action": PolicyFeature("ACTION", (3,))},
        hidden_dim=32,
        **overrides,
    )


def _task(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    state, env = torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)
    action = torch.stack([state[:, 0] + env[:, 1], state[:, 1] * 0.5, -state[:, 2]], dim=-1)
    return {
        "observation.state": state,
        "observation.environment_state": env,
        "observation.images.top": torch.rand(n, 3, 8, 8, generator=g),
        "action": action,
    }


def test_loss_goes_down_on_a_tiny_task():
    torch.manual_seed(0)
    policy = MLPPolicy(_config()).train()
    batch = _task()
    optimizer = torch.optim.Adam(policy.get_optim_params(), lr=1e-2)
    first = policy(batch)[0].item()
    for _ in range(60):
        loss, info = policy(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert set(info) == {"mse_loss"}
    assert info["mse_loss"] < 0.1 * first


def test_deterministic_with_zero_dropout():
    batch = _task()
    torch.manual_seed(1)
    a = MLPPolicy(_config())
    torch.manual_seed(1)
    b = MLPPolicy(_config())
    a.train(), b.train()
    assert a(batch)[0].item() == b(batch)[0].item() == a(batch)[0].item()


def test_uses_frame_zero_of_an_action_chunk_and_its_pad_mask():
    torch.manual_seed(0)
    policy = MLPPolicy(_config())
    batch = _task(n=4)
    chunked = {**batch, "action": torch.stack([batch["action"], batch["action"] + 5], dim=1)}
    assert policy(chunked)[0].item() == pytest.approx(policy(batch)[0].item())
    padded = {**chunked, "action_is_pad": torch.ones(4, 2, dtype=torch.bool)}
    assert policy(padded)[0].item() == 0.0


def test_inference_shapes_and_images_are_ignored():
    policy = MLPPolicy(_config())
    obs = {k: v for k, v in _task(n=5).items() if k != "action"}
    assert policy.select_action(obs).shape == (5, 3)
    assert policy.predict_action_chunk(obs).shape == (5, 1, 3)
    changed = {**obs, "observation.images.top": torch.zeros(5, 3, 8, 8)}
    torch.testing.assert_close(policy.select_action(changed), policy.select_action(obs))
    policy.reset()


def test_protocol():
    cfg = _config(n_blocks=3)
    policy = MLPPolicy(cfg)
    assert policy_class(cfg) is MLPPolicy and MLPPolicy.name == "mlp"
    assert MLPPolicy._fsdp_wrap_modules == ["MLPBlock"]
    assert sum(isinstance(m, MLPBlock) for m in policy.modules()) == 3
    assert len(policy.get_optim_params()) == 1


def test_needs_a_state_input():
    cfg = MLPConfig(
        input_features={"observation.images.top": PolicyFeature("VISUAL", (3, 8, 8))},
        output_features={"action": PolicyFeature("ACTION", (3,))},
    )
    with pytest.raises(ValueError, match="observation.state"):
        MLPPolicy(cfg)
