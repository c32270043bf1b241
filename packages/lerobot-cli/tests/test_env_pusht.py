"""``--env.type=pusht``: LeRobot 0.6.1's PushtEnv config, the vector env it builds, and LeRobot's mapping of
its observations to a policy's inputs. Needs lerobot-cli[pusht] (the workspace root installs it)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from lerobot_cli.envs import env_config
from lerobot_cli.envs.config import PushtEnvConfig
from lerobot_cli.envs.make import EnvUnavailableError, make_vector_env
from lerobot_cli.envs.observation import ObservationError, preprocess_observation
from lerobot_cli.features import FeatureType, PolicyFeature

gym = pytest.importorskip("gymnasium", reason="lerobot-cli[pusht] (uv sync installs it)")
pytest.importorskip("gym_pusht", reason="lerobot-cli[pusht] (uv sync installs it)")

# LeRobot 0.6.1's lerobot/envs/configs.py PushtEnv, field by field (the interop driver
# tools/interop/pusht_eval_lerobot_interop.py compares against LeRobot's class itself)
LEROBOT_PUSHT = {
    "task": "PushT-v0",
    "fps": 10,
    "episode_length": 300,
    "obs_type": "pixels_agent_pos",
    "render_mode": "rgb_array",
    "visualization_width": 384,
    "visualization_height": 384,
    "observation_height": 384,
    "observation_width": 384,
    "max_parallel_tasks": 1,
    "disable_env_checker": True,
}


def test_defaults_are_lerobots():
    cfg = env_config("pusht")
    assert {name: getattr(cfg, name) for name in LEROBOT_PUSHT} == LEROBOT_PUSHT
    assert cfg.gym_id == "gym_pusht/PushT-v0"
    assert cfg.gym_kwargs == {
        "obs_type": "pixels_agent_pos",
        "render_mode": "rgb_array",
        "visualization_width": 384,
        "visualization_height": 384,
        "max_episode_steps": 300,
    }
    assert cfg.features == {
        "action": PolicyFeature(FeatureType.ACTION, (2,)),
        "agent_pos": PolicyFeature(FeatureType.STATE, (2,)),
        "pixels": PolicyFeature(FeatureType.VISUAL, (384, 384, 3)),
    }
    assert cfg.features_map == {
        "action": "action",
        "agent_pos": "observation.state",
        "environment_state": "observation.environment_state",
        "pixels": "observation.image",
    }
    state = env_config("pusht", obs_type="environment_state_agent_pos")
    assert state.features["environment_state"] == PolicyFeature(FeatureType.ENV, (16,))
    assert "pixels" not in state.features


@pytest.mark.parametrize(
    ("env_type", "fields", "line"),
    [
        ("cartpole", {}, "--env.type: invalid choice 'cartpole' (choose from pusht)"),
        ("pusht", {"episode_length": 0}, "--env.episode_length must be a positive integer, got 0"),
        ("pusht", {"obs_type": "pixels"}, "--env.obs_type: invalid choice 'pixels'"),
        ("pusht", {"render_mode": "human"}, "--env.render_mode: invalid choice 'human'"),
        ("pusht", {"task": "gym_pusht/PushT-v0"}, "--env.task must name one gym_pusht env"),
    ],
)
def test_bad_config_is_one_line(env_type, fields, line):
    with pytest.raises(ValueError) as info:
        env_config(env_type, **fields)
    assert str(info.value).startswith(line)
    assert "\n" not in str(info.value)


def test_vector_env_is_built_as_lerobot_builds_it():
    env = make_vector_env(PushtEnvConfig(episode_length=7), n_envs=2)
    try:
        assert isinstance(env, gym.vector.SyncVectorEnv)
        assert env.num_envs == 2
        assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        assert env.call("_max_episode_steps") == (7, 7)
        obs, _ = env.reset(seed=[3, 4])
        assert obs["pixels"].shape == (2, 96, 96, 3) and obs["pixels"].dtype == np.uint8
        assert obs["agent_pos"].shape == (2, 2)
        assert env.envs[0].render().shape == (384, 384, 3)  # visualization_* size, off screen
    finally:
        env.close()
    one = make_vector_env(PushtEnvConfig(), n_envs=1, use_async_envs=True)  # one env is never async
    try:
        assert isinstance(one, gym.vector.SyncVectorEnv)
    finally:
        one.close()


def test_same_seed_same_episode_start():
    a, b = make_vector_env(PushtEnvConfig(), 2), make_vector_env(PushtEnvConfig(), 1)
    try:
        obs_a, _ = a.reset(seed=[11, 12])
        obs_b, _ = b.reset(seed=[12])
        assert np.array_equal(obs_a["agent_pos"][1], obs_b["agent_pos"][0])
        assert np.array_equal(obs_a["pixels"][1], obs_b["pixels"][0])
        assert not np.array_equal(obs_a["agent_pos"][0], obs_a["agent_pos"][1])
    finally:
        a.close(), b.close()


def test_unknown_task_is_one_line():
    with pytest.raises(
        EnvUnavailableError, match=r"^--env.task=PushU-v0: gym_pusht has no env 'PushU-v0' \(it has"
    ):
        make_vector_env(PushtEnvConfig(task="PushU-v0"), 1)


class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "gym_pusht":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_missing_extra_is_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [_Blocked(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "gym_pusht", raising=False)
    with pytest.raises(EnvUnavailableError) as info:
        make_vector_env(PushtEnvConfig(), 1)
    assert str(info.value) == (
        "--env.type=pusht needs lerobot-cli[pusht] (gym_pusht is not installed): pip install "
        "'lerobot-cli[pusht]' (in this repository: uv sync)"
    )


def test_observation_mapping_on_pusht_output():
    """LeRobot's preprocess_observation: uint8 HWC -> float32 CHW / 255, agent_pos -> float32 state."""
    env = make_vector_env(PushtEnvConfig(), 2)
    try:
        obs, _ = env.reset(seed=[0, 1])
        obs, *_ = env.step(np.array([[100.0, 200.0], [300.0, 50.0]], dtype=np.float32))
    finally:
        env.close()
    batch = preprocess_observation(obs)
    assert set(batch) == {"observation.image", "observation.state"}
    image, state = batch["observation.image"], batch["observation.state"]
    assert image.dtype == torch.float32 and image.shape == (2, 3, 96, 96) and image.is_contiguous()
    expected = torch.from_numpy(obs["pixels"]).permute(0, 3, 1, 2).float() / 255
    assert torch.equal(image, expected)
    assert 0.0 <= image.min() and image.max() <= 1.0
    assert state.dtype == torch.float32 and torch.equal(state, torch.from_numpy(obs["agent_pos"]).float())


def test_observation_mapping_of_other_layouts():
    cams = {"top": np.full((1, 4, 6, 3), 255, np.uint8), "wrist": np.zeros((4, 6, 3), np.uint8)}
    batch = preprocess_observation(
        {"pixels": cams, "environment_state": np.arange(16.0), "extra": np.ones(3, np.float64)}
    )
    assert (
        batch["observation.images.top"].shape == (1, 3, 4, 6) and batch["observation.images.top"].max() == 1
    )
    assert batch["observation.images.wrist"].shape == (1, 3, 4, 6)  # a single env's frame gets a batch dim
    assert batch["observation.environment_state"].shape == (1, 16)
    assert batch["observation.extra"].dtype == torch.float32 and batch["observation.extra"].shape == (1, 3)


@pytest.mark.parametrize(
    ("pixels", "line"),
    [
        (np.zeros((1, 3, 8, 8), np.uint8), "observation.image: expected channel-last pixels"),
        (np.zeros((1, 8, 8, 3), np.float32), "observation.image: expected uint8 pixels"),
    ],
)
def test_pixels_lerobot_refuses_are_refused(pixels, line):
    with pytest.raises(ObservationError, match="^" + line):
        preprocess_observation({"pixels": pixels})


def test_async_envs_roll_out_what_sync_envs_do():
    """--eval.use_async_envs: one env per worker process (forkserver), the same rollouts as in-process."""
    from lerobot_cli.evaluation.rollout import rollout_batch

    class Scripted(torch.nn.Module):
        def reset(self):
            self.t = 0

        def select_action(self, batch):
            self.t += 1
            return (
                batch["observation.state"] * 0.5 + 128.0 + 40.0 * batch["observation.image"][:, 0, 48, 48:50]
            )

    cfg = PushtEnvConfig(episode_length=6)
    runs = {}
    for use_async in (False, True):
        env = make_vector_env(cfg, 2, use_async_envs=use_async)
        try:
            assert isinstance(env, gym.vector.AsyncVectorEnv) == use_async
            runs[use_async] = rollout_batch(env, Scripted(), lambda x: x, lambda x: x, [21, 22])
        finally:
            env.close()
    assert torch.equal(runs[False].actions, runs[True].actions)
    assert torch.equal(runs[False].dones, runs[True].dones)
    # gym-pusht's reward is reproducible to 1 ulp only, even between two sync envs (see below)
    assert torch.allclose(runs[False].rewards, runs[True].rewards, rtol=0, atol=PUSHT_REWARD_ULPS)


# gym-pusht 0.1.8 computes its reward (the block's coverage of the goal) from a shapely MultiPolygon built
# by iterating pymunk's Body.shapes, a set ordered by object address: the parts' order, and so the last
# bit of the intersection's area, changes from one env instance to the next (the physics does not: poses
# and pixels are bit-equal). Rewards are in [0, 1]; a few ulps of 1.0 bound the difference.
PUSHT_REWARD_ULPS = 4 * 2.0**-52


def test_pusht_reward_varies_only_in_its_last_bits():
    """Why PushT rewards are compared to PUSHT_REWARD_ULPS: same seed and actions in fresh envs give
    bit-equal observations and rewards equal to a few ulps (if gym-pusht fixes its order, tighten this)."""
    runs = []
    for _ in range(4):
        env = make_vector_env(PushtEnvConfig(episode_length=30), 1)
        try:
            obs, _ = env.reset(seed=[21])
            steps = []
            for _ in range(30):
                action = (obs["agent_pos"] * 0.5 + 128.0).astype(np.float32)
                obs, reward, *_ = env.step(action)
                steps.append((obs["agent_pos"].copy(), obs["pixels"].copy(), float(reward[0])))
            runs.append(steps)
        finally:
            env.close()
    for run in runs[1:]:
        for (pos, pixels, reward), (pos0, pixels0, reward0) in zip(run, runs[0], strict=True):
            assert np.array_equal(pos, pos0) and np.array_equal(pixels, pixels0)
            assert abs(reward - reward0) <= PUSHT_REWARD_ULPS
