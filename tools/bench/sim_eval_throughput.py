"""Env steps/s of a PushT evaluation here (``lerobot_cli.evaluation``), per vector-env size and sync/async:
what sizes ``--eval.batch_size`` and ``--eval.use_async_envs`` sensibly, and what a full eval costs
(LeRobot's defaults: 50 episodes of up to 300 steps = 15,000 env steps).

A tiny MLP policy with its real processors (normalise, unnormalise) drives gym-pusht; steps/s counts
every env step of every env (a done env is still stepped, as LeRobot's rollout does), over whole
rollouts of ``--episode-length`` steps, timed after one warm-up rollout. Also the bare env (random
actions, one env, no policy) for the simulator's own rate.

Usage: uv run python tools/bench/sim_eval_throughput.py [--episode-length 50] [--sizes 1 2 4] [--async]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def tiny_policy():
    import torch
    from lerobot_cli.features import PolicyFeature
    from lerobot_cli.policies.mlp.config import MLPConfig
    from lerobot_cli.policies.mlp.modeling import MLPPolicy
    from lerobot_cli.processors import make_pre_post_processors

    config = MLPConfig(
        input_features={
            "observation.state": PolicyFeature("STATE", (2,)),
            "observation.image": PolicyFeature("VISUAL", (3, 96, 96)),
        },
        output_features={"action": PolicyFeature("ACTION", (2,))},
        hidden_dim=64,
    )
    box = {"mean": [256.0, 256.0], "std": [128.0, 128.0]}
    image = {"mean": [[[0.5]]] * 3, "std": [[[0.25]]] * 3}
    torch.manual_seed(0)
    pre, post = make_pre_post_processors(
        config, {"observation.state": box, "observation.image": image, "action": box}
    )
    return MLPPolicy(config).eval(), pre, post


def bare_env_rate(episode_length: int, steps: int) -> float:
    import gym_pusht  # noqa: F401
    import gymnasium as gym

    env = gym.make(
        "gym_pusht/PushT-v0",
        obs_type="pixels_agent_pos",
        render_mode="rgb_array",
        visualization_width=384,
        visualization_height=384,
        max_episode_steps=episode_length,
    )
    env.reset(seed=0)
    env.action_space.seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def eval_rate(size: int, use_async: bool, episode_length: int, rollouts: int) -> float:
    import torch
    from lerobot_cli.envs import env_config
    from lerobot_cli.envs.make import make_vector_env
    from lerobot_cli.evaluation.rollout import rollout_batch

    policy, pre, post = tiny_policy()
    env = make_vector_env(env_config("pusht", episode_length=episode_length), size, use_async)
    try:
        with torch.no_grad():
            rollout_batch(env, policy, pre, post, list(range(size)))  # warm-up (async workers start)
            start = time.perf_counter()
            steps = 0
            for r in range(rollouts):
                out = rollout_batch(env, policy, pre, post, list(range(size * (r + 1), size * (r + 2))))
                steps += out.dones.numel()
            return steps / (time.perf_counter() - start)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episode-length", type=int, default=50)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--async", dest="use_async", action="store_true", help="also AsyncVectorEnv")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"cpus {os.cpu_count()}, episode_length {args.episode_length}, rollouts {args.rollouts}")
    print(f"bare env (1 env, random actions): {bare_env_rate(args.episode_length, 300):.0f} steps/s")
    for use_async in [False, True] if args.use_async else [False]:
        for size in args.sizes:
            rate = eval_rate(size, use_async, args.episode_length, args.rollouts)
            kind = "async" if use_async and size > 1 else "sync"
            print(f"eval, {size} env(s), {kind}: {rate:.0f} env steps/s")


if __name__ == "__main__":
    main()
