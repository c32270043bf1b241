"""``--env.type=aloha``: LeRobot 0.6.1's AlohaEnv config, the vector env it builds (MuJoCo rendered off screen
with MUJOCO_GL=egl when unset, in async workers too) and a short real rollout. Needs lerobot-cli[aloha] (the
workspace root installs it) and a working EGL (a GPU driver's or Mesa's); gym-aloha steps at ~5/s on a CPU,
so the rollouts here are a few steps long."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.envs import env_config
from lerobot_cli.envs.config import ALOHA_TASKS, AlohaEnvConfig
from lerobot_cli.envs.make import EnvUnavailableError, make_vector_env
from lerobot_cli.envs.observation import preprocess_observation
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.mlp.config import MLPConfig
from lerobot_cli.sim_eval import check_policy_fits_env

gym = pytest.importorskip("gymnasium", reason="lerobot-cli[aloha] (uv sync installs it)")
pytest.importorskip("gym_aloha", reason="lerobot-cli[aloha] (uv sync installs it)")

# LeRobot 0.6.1's lerobot/envs/configs.py AlohaEnv (and its EnvConfig base), field by field
LEROBOT_ALOHA = {
    "task": "AlohaInsertion-v0",
    "fps": 50,
    "episode_length": 400,
    "obs_type": "pixels_agent_pos",
    "observation_height": 480,
    "observation_width": 640,
    "render_mode": "rgb_array",
    "max_parallel_tasks": 1,
    "disable_env_checker": True,
}


def test_defaults_are_lerobots():
    cfg = env_config("aloha")
    assert {name: getattr(cfg, name) for name in LEROBOT_ALOHA} == LEROBOT_ALOHA
    assert cfg.gym_id == "gym_aloha/AlohaInsertion-v0"
    assert cfg.gym_kwargs == {
        "obs_type": "pixels_agent_pos",
        "render_mode": "rgb_array",
        "max_episode_steps": 400,
    }
    assert cfg.features == {
        "action": PolicyFeature(FeatureType.ACTION, (14,)),
        "agent_pos": PolicyFeature(FeatureType.STATE, (14,)),
        "pixels/top": PolicyFeature(FeatureType.VISUAL, (480, 640, 3)),
    }
    assert cfg.features_map == {
        "action": "action",
        "agent_pos": "observation.state",
        "top": "observation.image.top",
        "pixels/top": "observation.images.top",
    }


def test_tasks_are_the_ids_gym_aloha_registers():
    from gymnasium.envs.registration import registry

    assert {name for name in registry if name.startswith("gym_aloha/")} == {
        f"gym_aloha/{task}" for task in ALOHA_TASKS
    }
    assert env_config("aloha", task="AlohaTransferCube-v0").gym_id == "gym_aloha/AlohaTransferCube-v0"


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"task": "PushT-v0"}, "--env.task: invalid choice 'PushT-v0' (choose from AlohaInsertion-v0, "),
        ({"obs_type": "pixels"}, "--env.obs_type: invalid choice 'pixels' (choose from pixels_agent_pos)"),
        ({"render_mode": "human"}, "--env.render_mode: invalid choice 'human'"),
        ({"episode_length": 0}, "--env.episode_length must be a positive integer, got 0"),
        ({"observation_height": -1}, "--env.observation_height must be a positive integer, got -1"),
    ],
)
def test_bad_config_is_one_line(fields, line):
    with pytest.raises(ValueError) as info:
        env_config("aloha", **fields)
    assert str(info.value).startswith(line)
    assert "\n" not in str(info.value)


def test_flags_build_it():
    flags = {
        "policy.type": "mlp",
        "dataset.repo_id": "x/y",
        "env.type": "aloha",
        "env.task": "AlohaTransferCube-v0",
        "env.episode_length": "3",
        "env.fps": "25",
    }
    assert build_train_config(flags).config.env == AlohaEnvConfig(
        task="AlohaTransferCube-v0", episode_length=3, fps=25
    )
    assert build_train_config({**flags, "env.task": "AlohaInsertion-v0"}).config.env.gym_id == (
        "gym_aloha/AlohaInsertion-v0"
    )


class Zeros(torch.nn.Module):
    """Holds still (zero joint targets) and keeps the batches it was given."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def reset(self):
        self.batches.clear()

    def select_action(self, batch):
        self.batches.append(batch)
        return torch.zeros(batch["observation.state"].shape[0], 14)


def test_rollout_with_egl_when_mujoco_gl_is_unset(monkeypatch):
    from lerobot_cli.evaluation.rollout import rollout_batch

    monkeypatch.delenv("MUJOCO_GL", raising=False)
    env = make_vector_env(AlohaEnvConfig(episode_length=3), 2)
    try:
        assert os.environ["MUJOCO_GL"] == "egl"
        assert isinstance(env, gym.vector.SyncVectorEnv) and env.call("_max_episode_steps") == (3, 3)
        policy = Zeros()
        run = rollout_batch(env, policy, lambda x: x, lambda x: x, [3, 4])
        first = policy.batches[0]
        action_shape = env.single_action_space.shape
        again = preprocess_observation(env.reset(seed=[3, 4])[0])
    finally:
        env.close()
    one = make_vector_env(AlohaEnvConfig(episode_length=3), 1)
    try:
        alone = preprocess_observation(one.reset(seed=[4])[0])
    finally:
        one.close()
    assert len(policy.batches) == 3 and run.actions.shape == (2, 3, 14) and run.dones[:, -1].all()
    image, state = first["observation.images.top"], first["observation.state"]
    assert image.shape == (2, 3, 480, 640) and image.dtype == torch.float32
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.max() > 0
    assert state.shape == (2, 14) and state.dtype == torch.float32
    assert first["task"] == ["insertion", "insertion"]  # gym-aloha's `task` attribute, as LeRobot reads it
    # the same seeds, the same first observation (in the same envs and in a new one); another seed, another
    # scene (the peg's and socket's poses: the arms start where they always do)
    assert torch.equal(again["observation.images.top"], image)
    assert torch.equal(again["observation.state"], state)
    assert torch.equal(alone["observation.images.top"][0], image[1])
    assert torch.equal(alone["observation.state"][0], state[1])
    assert not torch.equal(image[0], image[1])
    # a policy trained on LeRobot's aloha_sim_* datasets (their camera, state and action) fits the env
    aloha_sim = MLPConfig(
        input_features={
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 480, 640)),
            "observation.state": PolicyFeature(FeatureType.STATE, (14,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (14,))},
    )
    check_policy_fits_env(aloha_sim, {}, first, action_shape)


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env={**base, **env},
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_async_workers_get_mujoco_gl_from_a_forkserver_started_before_it():
    """The forkserver (started here before MUJOCO_GL is set, as an earlier PushT eval would) forks workers
    with its own environment: without MUJOCO_GL each would pick GLFW, which fails with no display."""
    done = _run(
        """
        import multiprocessing.forkserver, os
        multiprocessing.forkserver.ensure_running()
        from lerobot_cli.envs.config import AlohaEnvConfig
        from lerobot_cli.envs.make import make_vector_env
        env = make_vector_env(AlohaEnvConfig(episode_length=2), 2, use_async_envs=True)
        try:
            obs, _ = env.reset(seed=[0, 1])
            top = obs["pixels"]["top"]
            print(type(env).__name__, os.environ["MUJOCO_GL"], top.shape, top.max())
        finally:
            env.close()
        """,
        {},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    name, backend, *shape_and_max = done.stdout.split()
    assert (name, backend) == ("AsyncVectorEnv", "egl")
    assert " ".join(shape_and_max[:-1]) == "(2, 480, 640, 3)" and int(shape_and_max[-1]) > 0


def test_no_working_gl_backend_is_one_line():
    done = _run(
        """
        from lerobot_cli.envs.config import AlohaEnvConfig
        from lerobot_cli.envs.make import EnvUnavailableError, make_vector_env
        try:
            make_vector_env(AlohaEnvConfig(), 1)
        except EnvUnavailableError as exc:
            print(exc)
        """,
        {"MUJOCO_GL": "glfw"},  # no display here: GLFW cannot make a context
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("\n") == 1
    line = done.stdout.strip()
    assert line.startswith("--env.type=aloha cannot render with MUJOCO_GL=glfw (FatalError: ")
    assert line.endswith(
        "MuJoCo renders without a display with MUJOCO_GL=egl (libEGL: a GPU driver's, or Mesa's: apt install "
        "libegl1) or MUJOCO_GL=osmesa (apt install libosmesa6)"
    )


class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "gym_aloha":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_missing_extra_is_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [_Blocked(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "gym_aloha", raising=False)
    with pytest.raises(EnvUnavailableError) as info:
        make_vector_env(AlohaEnvConfig(), 1)
    assert str(info.value) == (
        "--env.type=aloha needs lerobot-cli[aloha] (gym_aloha is not installed): pip install "
        "'lerobot-cli[aloha]' (in this repository: uv sync)"
    )
