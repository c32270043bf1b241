"""Batched rollouts, per-episode results and ``eval_info.json`` as LeRobot 0.6.1's ``lerobot-eval`` makes
them; one process and N ranks' shares of the episode plan give the same episodes. A small in-test
gymnasium env with PushT's observation keys (episodes of different lengths, successes, rewards), then
gym-pusht itself with a tiny real policy. Needs lerobot-cli[pusht] (gymnasium, gym-pusht)."""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import pytest
import torch
from lerobot_cli.evaluation.plan import EpisodePlan, RolloutBatch
from lerobot_cli.evaluation.results import EpisodeResult, episode_results, eval_info, write_eval_info
from lerobot_cli.evaluation.rollout import BatchRollout, RolloutError, rollout_batch
from lerobot_cli.evaluation.run import evaluate_batches

gym = pytest.importorskip("gymnasium", reason="lerobot-cli[pusht] (uv sync installs it)")

REACH = "simeval_test/Reach-v0"


class Reach(gym.Env):
    """A point reaching a goal: PushT's observation keys (8x8 ``pixels``, ``agent_pos``), a reward that
    grows near the goal, success (and termination) within 0.15 of it; where it starts is the seed's."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self):
        self.observation_space = gym.spaces.Dict(
            {
                "pixels": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
                "agent_pos": gym.spaces.Box(-2.0, 2.0, (2,), np.float64),
            }
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.steps = 0

    def _obs(self):
        pixels = np.zeros((8, 8, 3), np.uint8)
        x, y = np.clip(((self.pos + 2) * 2).astype(int), 0, 7)
        pixels[y, x] = (255, 128, 7)
        return {"pixels": pixels, "agent_pos": self.pos.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1.5, 1.5, 2)
        return self._obs(), {"is_success": False}

    def step(self, action):
        self.steps += 1
        self.pos = self.pos + 0.2 * np.clip(np.asarray(action, np.float64), -1, 1)
        dist = float(np.linalg.norm(self.pos))
        success = dist < 0.15
        return self._obs(), float(np.exp(-dist)), success, False, {"is_success": success}


if REACH not in gym.envs.registration.registry:
    gym.register(REACH, entry_point=Reach)


def reach_env(n: int, max_steps: int = 25):
    def make():
        return gym.make(REACH, disable_env_checker=True, max_episode_steps=max_steps)

    return gym.vector.SyncVectorEnv([make] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


class GoHome(torch.nn.Module):
    """A deterministic policy: a fixed linear map of the state towards the origin, plus the red channel
    of one pixel (so the image path is used); counts its calls."""

    def __init__(self):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.tensor([[-1.7, 0.3], [-0.2, -1.1]]))
        self.calls = self.resets = 0

    def reset(self):
        self.resets += 1

    def select_action(self, batch):
        self.calls += 1
        assert not torch.is_grad_enabled()
        return batch["observation.state"] @ self.gain.T + 0.01 * batch["observation.image"][:, 0, 0, :2]


def identity(x):
    return x


def roll(n_envs, seeds, policy=None, **kwargs):
    env = reach_env(n_envs)
    try:
        return rollout_batch(env, policy or GoHome(), identity, identity, seeds, **kwargs)
    finally:
        env.close()


def test_rollout_records_until_every_env_is_done():
    out = roll(3, [0, 1, 2])
    n_steps = out.dones.shape[1]
    assert out.actions.shape == (3, n_steps, 2) and out.rewards.shape == out.successes.shape == (3, n_steps)
    assert out.dones[:, -1].all()  # the last step has every env done
    assert (out.dones.int().diff(dim=1) >= 0).all()  # latched
    assert out.successes.any()  # the policy reaches the goal in some env
    lengths = torch.argmax(out.dones.int(), dim=1)
    assert len(set(lengths.tolist())) > 1  # envs finish at different steps: the mask matters


def test_rollout_stops_at_max_episode_steps():
    env = reach_env(2, max_steps=4)
    try:
        out = rollout_batch(env, GoHome(), identity, identity, [0, 1], keep_stepping=lambda done: True)
    finally:
        env.close()
    assert out.dones.shape[1] == 4 and out.dones[:, -1].all()


def test_same_seeds_same_rollout_and_seeds_matter():
    a, b, c = roll(2, [5, 6]), roll(2, [5, 6]), roll(2, [6, 5])
    assert torch.equal(a.actions, b.actions) and torch.equal(a.rewards, b.rewards)
    assert not torch.equal(a.actions[0], c.actions[0])


def test_keep_stepping_calls_the_policy_without_changing_the_rollout():
    """Lockstep: once the envs here are done, the policy is still called (collectives) while another rank
    runs; nothing more is recorded and the env is not stepped."""
    alone_policy, lock_policy = GoHome(), GoHome()
    alone = roll(2, [0, 1], alone_policy)
    n = alone.dones.shape[1]
    extra = 5
    steps = []

    def others_still_running(all_done_here):
        steps.append(all_done_here)
        return len(steps) <= n + extra

    lock = roll(2, [0, 1], lock_policy, keep_stepping=others_still_running)
    for field in ("actions", "rewards", "successes", "dones"):
        assert torch.equal(getattr(alone, field), getattr(lock, field)), field
    assert alone_policy.calls == n and lock_policy.calls == n + extra
    assert steps[:n] == [False] * n and all(steps[n:])


class Described(Reach):
    task_description = "reach the origin"


DESCRIBED = "simeval_test/Described-v0"
if DESCRIBED not in gym.envs.registration.registry:
    gym.register(DESCRIBED, entry_point=Described)


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize(("env_id", "task"), [(REACH, ""), (DESCRIBED, "reach the origin")])
def test_task_is_lerobots_and_async_workers_survive_its_lookup(env_id, task, use_async):
    """LeRobot's batch["task"]: the envs' task_description, else "" (PushT has none); in async envs,
    asking a worker for an attribute it lacks would shut it down, so the lookup must not."""
    seen = []

    class Recording(GoHome):
        def select_action(self, batch):
            seen.append(batch["task"])
            return super().select_action(batch)

    def make():
        return gym.make(env_id, disable_env_checker=True, max_episode_steps=3)

    cls = gym.vector.AsyncVectorEnv if use_async else gym.vector.SyncVectorEnv
    env = cls([make] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        out = rollout_batch(env, Recording(), identity, identity, [0, 1])
    finally:
        env.close()
    assert seen and all(t == [task, task] for t in seen)
    assert out.dones[:, -1].all()


def test_action_of_the_wrong_rank_is_one_line():
    class Flat(GoHome):
        def select_action(self, batch):
            return super().select_action(batch).flatten()

    with pytest.raises(RolloutError, match=r"^the policy's action must be \(batch, action_dim\)"):
        roll(2, [0, 1], Flat())


def test_episode_results_keep_one_step_past_done_as_lerobot():
    """LeRobot's mask is arange(n) <= done_index + 1: the step after an env's done still counts."""
    rollout = BatchRollout(
        actions=torch.zeros(2, 4, 2),
        rewards=torch.tensor([[1.0, 2.0, 4.0, 8.0], [0.5, 0.25, 0.125, 16.0]], dtype=torch.float64),
        successes=torch.tensor([[False, True, False, False], [False, False, False, True]]),
        dones=torch.tensor([[False, True, True, True], [False, False, False, True]]),
    )
    batch = RolloutBatch(index=3, seeds=(40, 41), episodes=(6, 7))
    assert episode_results(batch, rollout) == [
        EpisodeResult(episode_ix=6, sum_reward=7.0, max_reward=4.0, success=True, seed=40),
        EpisodeResult(episode_ix=7, sum_reward=16.875, max_reward=16.0, success=True, seed=41),
    ]
    padded = RolloutBatch(index=3, seeds=(40, 41), episodes=(6,))  # the last batch's extra env is dropped
    assert [r.episode_ix for r in episode_results(padded, rollout)] == [6]
    assert episode_results(RolloutBatch(index=0, seeds=(1, 2), episodes=(), filler=True), rollout) == []


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_together_give_the_one_process_results(world_size):
    plan = EpisodePlan(n_episodes=7, batch_size=2, seed=100)
    env = reach_env(2)
    try:
        one = evaluate_batches(env, GoHome(), identity, identity, plan.for_rank(0, 1))
        shares = [
            evaluate_batches(env, GoHome(), identity, identity, plan.for_rank(r, world_size))
            for r in range(world_size)
        ]
    finally:
        env.close()
    assert [r.episode_ix for r in one] == list(range(7))
    assert [r.seed for r in one] == list(range(100, 107))
    assert sorted((r for share in shares for r in share), key=lambda r: r.episode_ix) == one
    assert len({r.sum_reward for r in one}) > 1


def test_evaluate_restores_the_policy_mode():
    policy = GoHome().train()
    env = reach_env(1)
    try:
        evaluate_batches(
            env, policy, identity, identity, EpisodePlan(n_episodes=1, batch_size=1, seed=0).batches()
        )
    finally:
        env.close()
    assert policy.training and policy.resets == 1


def _results():
    return [
        EpisodeResult(episode_ix=1, sum_reward=3.0, max_reward=1.0, success=False, seed=11),
        EpisodeResult(episode_ix=0, sum_reward=5.0, max_reward=2.0, success=True, seed=10),
    ]


def test_eval_info_is_lerobots_schema(tmp_path):
    info = eval_info(_results(), task_group="pusht", eval_s=4.0)
    metrics = {"avg_sum_reward": 4.0, "avg_max_reward": 1.5, "pc_success": 50.0, "n_episodes": 2}
    no_videos = {"video_paths": [], "predicted_video_paths": []}
    assert info == {
        "per_task": [
            {
                "task_group": "pusht",
                "task_id": 0,
                "metrics": {"sum_rewards": [5.0, 3.0], "max_rewards": [2.0, 1.0], "successes": [True, False]}
                | no_videos,
            }
        ],
        "per_group": {"pusht": metrics | no_videos},
        "overall": metrics | {"eval_s": 4.0, "eval_ep_s": 2.0} | no_videos,
        "per_episode": [
            {"episode_ix": 0, "sum_reward": 5.0, "max_reward": 2.0, "success": True, "seed": 10},
            {"episode_ix": 1, "sum_reward": 3.0, "max_reward": 1.0, "success": False, "seed": 11},
        ],
        "aggregated": {
            "avg_sum_reward": 4.0,
            "avg_max_reward": 1.5,
            "pc_success": 50.0,
            "eval_s": 4.0,
            "eval_ep_s": 2.0,
        },
    }
    path = write_eval_info(tmp_path / "eval", info)
    assert path == tmp_path / "eval" / "eval_info.json"
    assert json.loads(path.read_text()) == info
    assert [p.name for p in path.parent.iterdir()] == ["eval_info.json"]  # no temporary left


def test_eval_info_refuses_missing_or_repeated_episodes():
    with pytest.raises(ValueError, match=r"^eval results must cover episodes 0..n-1 once each, got \[1\]"):
        eval_info(_results()[:1], task_group="pusht", eval_s=1.0)
    with pytest.raises(ValueError, match="got \\[0, 0, 1\\]"):
        eval_info([*_results(), _results()[1]], task_group="pusht", eval_s=1.0)


def test_eval_info_is_not_written_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    (tmp_path / "eval_info.json").symlink_to(target)
    with pytest.raises(Exception, match="symlink|link"):
        write_eval_info(tmp_path, eval_info(_results(), task_group="pusht", eval_s=1.0))
    assert target.read_text() == "keep"


# ---------------------------------------------------------------- gym-pusht with a tiny real policy


def test_pusht_rollout_with_a_tiny_mlp_and_its_processors(tmp_path):
    pytest.importorskip("gym_pusht", reason="lerobot-cli[pusht] (uv sync installs it)")
    from lerobot_cli.envs import env_config
    from lerobot_cli.envs.make import make_vector_env
    from lerobot_cli.features import PolicyFeature
    from lerobot_cli.policies.mlp.config import MLPConfig
    from lerobot_cli.policies.mlp.modeling import MLPPolicy
    from lerobot_cli.processors import make_pre_post_processors

    cfg = env_config("pusht", episode_length=12)
    config = MLPConfig(
        input_features={
            "observation.state": PolicyFeature("STATE", (2,)),
            "observation.image": PolicyFeature("VISUAL", (3, 96, 96)),
        },
        output_features={"action": PolicyFeature("ACTION", (2,))},
        hidden_dim=16,
    )
    box = {"min": [0.0, 0.0], "max": [512.0, 512.0], "mean": [256.0, 256.0], "std": [128.0, 128.0]}
    image = {"mean": [[[0.5]], [[0.5]], [[0.5]]], "std": [[[0.25]], [[0.25]], [[0.25]]]}
    stats = {"observation.state": box, "observation.image": image, "action": box}
    torch.manual_seed(0)
    policy = MLPPolicy(config)
    pre, post = make_pre_post_processors(config, stats)
    plan = EpisodePlan(n_episodes=3, batch_size=2, seed=1000)
    env = make_vector_env(cfg, plan.batch_size)
    try:
        one = evaluate_batches(env, policy, pre, post, plan.for_rank(0, 1))
        two = [evaluate_batches(env, policy, pre, post, plan.for_rank(r, 2)) for r in range(2)]
        again = rollout_batch(env, policy, pre, post, plan.batches()[0].seeds)
        first = rollout_batch(env, policy, pre, post, plan.batches()[0].seeds)
    finally:
        env.close()
    assert [(r.episode_ix, r.seed) for r in one] == [(0, 1000), (1, 1001), (2, 1002)]
    both = sorted(two[0] + two[1], key=lambda r: r.episode_ix)
    assert [(r.episode_ix, r.seed, r.success) for r in both] == [
        (r.episode_ix, r.seed, r.success) for r in one
    ]
    # gym-pusht's rewards vary in their last bits between env instances and resets (test_env_pusht.py)
    for a, b in zip(both, one, strict=True):
        assert a.sum_reward == pytest.approx(b.sum_reward, rel=0, abs=1e-12)
        assert a.max_reward == pytest.approx(b.max_reward, rel=0, abs=1e-12)
    assert torch.equal(again.actions, first.actions) and again.actions.shape == (2, 12, 2)
    assert all(0.0 <= r.max_reward <= 1.0 and r.sum_reward >= 0.0 for r in one)
    info = eval_info(one, task_group=cfg.type, eval_s=1.0)
    path = write_eval_info(tmp_path, info)
    assert json.loads(path.read_text())["per_episode"][2]["seed"] == 1002
