"""Simulation evaluation in gym-pusht against LeRobot 0.6.1's own: the same env config, observation
mapping, rollouts and per-episode results, bit for bit.

    uv run python tools/interop/pusht_eval_lerobot_interop.py --lerobot-python <LeRobot env>/bin/python

The LeRobot side needs gym-pusht in LeRobot's env (``lerobot[pusht]``; ``--lerobot-site DIR`` adds a
directory to its ``sys.path`` instead, e.g. one made with ``uv pip install --target DIR --python <its
python> gym-pusht pymunk ...``).

1. ours (this env): ``PushtEnvConfig`` fields, ``gym_kwargs``, ``features``, ``features_map``; raw env
   observations (PushT's after a reset and a step, and an ALOHA-like one with a camera dict) and our
   ``preprocess_observation`` of them; an eval of ``N_EPISODES`` in batches of ``BATCH_SIZE`` from
   ``SEED`` (``evaluate_batches`` over ``EpisodePlan``) with a scripted policy, and each batch's actions.
2. LeRobot (its env, this script with ``--lerobot-side``): its ``PushtEnv`` config against ours, its
   ``preprocess_observation`` on the same raw observations, its ``eval_policy`` (per-episode results)
   and ``rollout`` (actions) with the same scripted policy, env, seeds; everything compared exactly.

The scripted policy is elementwise arithmetic on the state, one pixel and a step counter (no reduction,
no transcendental function), so both torches compute it to the same bits; what is compared is the env,
the mapping, the rollout loop and the result arithmetic. PushT's rewards are compared to 1e-12 (gym-pusht
itself varies their last bit, see ``PUSHT_REWARD_ATOL``), everything else exactly. Exit status 0
(``PASS``) means every comparison held.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

N_EPISODES, BATCH_SIZE, SEED, EPISODE_LENGTH = 5, 2, 1000, 20
REACH_EPISODES, REACH_BATCH, REACH_STEPS = 7, 3, 9


def scripted_action(state, image, t: int):
    """Towards the T, wobbling with the step and one red pixel: elementwise only."""
    wobble = float(t % 7) * 5.0
    return state * 0.5 + 128.0 + wobble + 40.0 * image[:, 0, 48, 48:50]


def reach_vector_env(n: int):
    """A vector env whose episodes end at different steps, with successes (PushT rarely ends before its
    time limit in a short test): a point pushed towards the origin, PushT's observation keys, Python's
    ``math`` for the reward (the same libm on both sides, whatever numpy each has)."""
    import math

    import gymnasium as gym
    import numpy as np

    class Reach(gym.Env):
        metadata = {"render_modes": ["rgb_array"], "render_fps": 10}  # noqa: RUF012

        def __init__(self):
            self.observation_space = gym.spaces.Dict(
                {
                    "pixels": gym.spaces.Box(0, 255, (96, 96, 3), np.uint8),
                    "agent_pos": gym.spaces.Box(-2.0, 2.0, (2,), np.float64),
                }
            )
            self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

        def _obs(self):
            pixels = np.zeros((96, 96, 3), np.uint8)
            pixels[48, 48:50, 0] = int(abs(self.pos[0]) * 100) % 256
            return {"pixels": pixels, "agent_pos": self.pos.copy()}

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.pos = self.np_random.uniform(-1.5, 1.5, 2)
            return self._obs(), {"is_success": False}

        def step(self, action):
            move = [max(-1.0, min(1.0, float(a))) for a in action]
            self.pos = np.array([self.pos[0] + 0.2 * move[0], self.pos[1] + 0.2 * move[1]])
            dist = math.hypot(float(self.pos[0]), float(self.pos[1]))
            success = dist < 0.15
            return self._obs(), math.exp(-dist), success, False, {"is_success": success}

    def make():
        return gym.wrappers.TimeLimit(Reach(), max_episode_steps=REACH_STEPS)

    return gym.vector.SyncVectorEnv([make] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def reach_action(state, image, t: int):
    """Towards the origin, a little off by one pixel: elementwise only."""
    return state * -1.3 + 0.01 * image[:, 0, 48, 48:50] + 0.0 * t


def raw_observations() -> dict[str, dict]:
    """Raw vector-env observations to map: PushT's after a reset and after one step, and a synthetic
    ALOHA-like one (a camera dict, 14-D state)."""
    import numpy as np
    from lerobot_cli.envs import env_config
    from lerobot_cli.envs.make import make_vector_env

    env = make_vector_env(env_config("pusht"), 2)
    try:
        reset, _ = env.reset(seed=[SEED, SEED + 1])
        stepped, *_ = env.step(np.array([[100.0, 300.0], [400.0, 50.0]], dtype=np.float32))
    finally:
        env.close()
    rng = np.random.default_rng(0)
    aloha = {
        "pixels": {"top": rng.integers(0, 256, (2, 48, 64, 3), dtype=np.uint8)},
        "agent_pos": rng.normal(size=(2, 14)),
    }
    return {"reset": reset, "stepped": stepped, "aloha": aloha}


def flatten(obs: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in obs.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def unflatten(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split("/")
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out


# gym-pusht's reward (the block's coverage of the goal, from a shapely MultiPolygon whose parts come from
# pymunk's Body.shapes, a set ordered by object address) changes in its last bit from one env instance to
# the next; poses, pixels, actions and successes do not. PushT rewards are compared to this; the other
# env's exactly.
PUSHT_REWARD_ATOL = 1e-12


def same_episodes(theirs: list[dict], ours: list[dict], exact: bool) -> bool:
    if len(theirs) != len(ours):
        return False
    for a, b in zip(theirs, ours, strict=True):
        if {k: v for k, v in a.items() if "reward" not in k} != {
            k: v for k, v in b.items() if "reward" not in k
        }:
            return False
        for key in ("sum_reward", "max_reward"):
            if a[key] != b[key] and (exact or abs(a[key] - b[key]) > PUSHT_REWARD_ATOL):
                return False
    return True


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def ours_write(work: Path) -> None:
    import numpy as np
    import torch
    from lerobot_cli.envs import env_config
    from lerobot_cli.envs.make import make_vector_env
    from lerobot_cli.envs.observation import preprocess_observation
    from lerobot_cli.evaluation.plan import EpisodePlan
    from lerobot_cli.evaluation.rollout import rollout_batch
    from lerobot_cli.evaluation.run import evaluate_batches
    from safetensors.torch import save_file

    cfg = env_config("pusht", episode_length=EPISODE_LENGTH)
    config = {
        "fields": {
            name: getattr(cfg, name)
            for name in (
                "task",
                "fps",
                "episode_length",
                "obs_type",
                "render_mode",
                "visualization_width",
                "visualization_height",
                "observation_height",
                "observation_width",
                "max_parallel_tasks",
                "disable_env_checker",
            )
        },
        "gym_id": cfg.gym_id,
        "gym_kwargs": cfg.gym_kwargs,
        "features": {k: [f.type.value, list(f.shape)] for k, f in cfg.features.items()},
        "features_map": cfg.features_map,
    }
    mapped = {}
    for name, obs in raw_observations().items():
        np.savez(work / f"raw_{name}.npz", **flatten(obs))
        mapped.update({f"{name}|{k}": v for k, v in preprocess_observation(obs).items()})
    save_file(mapped, str(work / "ours_mapped.safetensors"))

    class Scripted(torch.nn.Module):
        def __init__(self, act):
            super().__init__()
            self.act = act

        def reset(self):
            self.t = 0

        def select_action(self, batch):
            action = self.act(batch["observation.state"], batch["observation.image"], self.t)
            self.t += 1
            return action

    def identity(x):
        return x

    cases = (
        ("pusht", EpisodePlan(n_episodes=N_EPISODES, batch_size=BATCH_SIZE, seed=SEED), scripted_action),
        ("reach", EpisodePlan(n_episodes=REACH_EPISODES, batch_size=REACH_BATCH, seed=SEED), reach_action),
    )
    evals = {}
    for name, plan, act in cases:
        env = make_vector_env(cfg, plan.batch_size) if name == "pusht" else reach_vector_env(plan.batch_size)
        try:
            results = evaluate_batches(env, Scripted(act), identity, identity, plan.for_rank(0, 1))
            actions = {
                f"{name}_batch_{b.index}": rollout_batch(
                    env, Scripted(act), identity, identity, b.seeds
                ).actions.contiguous()
                for b in plan.batches()
            }
        finally:
            env.close()
        save_file(actions, str(work / f"ours_actions_{name}.safetensors"))
        evals[name] = [
            {"episode_ix": r.episode_ix, "sum_reward": r.sum_reward, "max_reward": r.max_reward,
             "success": r.success, "seed": r.seed}
            for r in results
        ]  # fmt: skip
        print(
            f"[ours] {name}: sum rewards {[round(r.sum_reward, 3) for r in results]}, "
            f"successes {[r.success for r in results]}",
            flush=True,
        )
    (work / "ours.json").write_text(json.dumps({"config": config, "per_episode": evals}))


# ---------------------------------------------------------------- LeRobot's side (imports lerobot)


def lerobot_side(work: Path) -> bool:
    import numpy as np
    import torch
    from lerobot.envs.configs import PushtEnv
    from lerobot.envs.factory import make_env
    from lerobot.envs.utils import preprocess_observation
    from lerobot.policies.pretrained import PreTrainedPolicy
    from lerobot.scripts.lerobot_eval import eval_policy, rollout
    from safetensors.torch import load_file

    ours = json.loads((work / "ours.json").read_text())
    ok = True

    cfg = PushtEnv(episode_length=EPISODE_LENGTH)
    theirs = {
        "fields": {name: getattr(cfg, name) for name in ours["config"]["fields"]},
        "gym_id": cfg.gym_id,
        "gym_kwargs": cfg.gym_kwargs,
        "features": {k: [f.type.value, list(f.shape)] for k, f in cfg.features.items()},
        "features_map": cfg.features_map,
    }
    for part, value in theirs.items():
        same = value == ours["config"][part]
        print(f"[lerobot] PushtEnv {part}: {'same' if same else f'DIFFERENT: {value} vs ours'}", flush=True)
        ok &= same

    mapped = load_file(str(work / "ours_mapped.safetensors"))
    for name in ("reset", "stepped", "aloha"):
        with np.load(work / f"raw_{name}.npz") as raw:
            obs = unflatten({k: raw[k] for k in raw.files})
        their_map = preprocess_observation(obs)
        our_map = {k.partition("|")[2]: v for k, v in mapped.items() if k.startswith(name + "|")}
        same = set(their_map) == set(our_map) and all(
            their_map[k].dtype == our_map[k].dtype and torch.equal(their_map[k], our_map[k])
            for k in their_map
        )
        print(
            f"[lerobot] preprocess_observation ({name}): {sorted(their_map)} "
            f"{'same' if same else 'DIFFERENT'}"
        )
        ok &= same

    class Scripted(PreTrainedPolicy):
        config_class = object
        name = "scripted"

        def __init__(self, act):
            torch.nn.Module.__init__(self)
            self.act = act

        def get_optim_params(self):
            return {}

        def reset(self):
            self.t = 0

        def forward(self, batch):
            raise NotImplementedError

        def predict_action_chunk(self, batch, **kwargs):
            raise NotImplementedError

        def select_action(self, batch, **kwargs):
            action = self.act(batch["observation.state"], batch["observation.image"], self.t)
            self.t += 1
            return action

    def identity(x):
        return x

    cases = (
        ("pusht", N_EPISODES, BATCH_SIZE, scripted_action),
        ("reach", REACH_EPISODES, REACH_BATCH, reach_action),
    )
    for name, n_episodes, batch_size, act in cases:
        env = (
            make_env(cfg, n_envs=batch_size)["pusht"][0] if name == "pusht" else reach_vector_env(batch_size)
        )
        try:
            with torch.no_grad():
                info = eval_policy(
                    env, Scripted(act), *[identity] * 4, n_episodes=n_episodes, start_seed=SEED
                )
            same = same_episodes(info["per_episode"], ours["per_episode"][name], exact=name != "pusht")
            print(f"[lerobot] {name}: eval_policy per_episode {'same' if same else 'DIFFERENT'}", flush=True)
            if not same:
                print(f"  LeRobot: {info['per_episode']}\n  ours:    {ours['per_episode'][name]}")
            ok &= same
            our_actions = load_file(str(work / f"ours_actions_{name}.safetensors"))
            for b in range(-(-n_episodes // batch_size)):
                seeds = list(range(SEED + b * batch_size, SEED + (b + 1) * batch_size))
                with torch.no_grad():
                    their = rollout(env, Scripted(act), *[identity] * 4, seeds=seeds)["action"]
                same = torch.equal(their, our_actions[f"{name}_batch_{b}"])
                print(
                    f"[lerobot] {name}: batch {b} actions {tuple(their.shape)} "
                    f"{'same' if same else 'DIFFERENT'}"
                )
                ok &= same
        finally:
            env.close()
    return ok


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lerobot-python", help="python of an env with lerobot 0.6.x")
    parser.add_argument(
        "--lerobot-site", help="a directory with gym-pusht for LeRobot's python (if not in it)"
    )
    parser.add_argument("--lerobot-side", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lerobot_side is not None:
        return 0 if lerobot_side(args.lerobot_side) else 1
    if not args.lerobot_python:
        parser.error("--lerobot-python is required")
    env = {**os.environ, "SDL_VIDEODRIVER": os.environ.get("SDL_VIDEODRIVER", "dummy")}
    side_env = dict(env)
    if args.lerobot_site:
        side_env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.lerobot_site, env.get("PYTHONPATH")]))
    probe = subprocess.run(
        [args.lerobot_python, "-c", "import gym_pusht"], check=False, env=side_env, capture_output=True
    )
    if probe.returncode != 0:
        print("FAIL: LeRobot's env has no gym-pusht (install lerobot[pusht] there, or pass --lerobot-site)")
        return 1
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ours_write(work)
        proc = subprocess.run(  # its stderr is its rollouts' progress bars: shown only when it fails
            [args.lerobot_python, str(Path(__file__).resolve()), "--lerobot-side", str(work)],
            check=False,
            env=side_env,
            stderr=subprocess.PIPE,
            text=True,
        )
        ok = proc.returncode == 0
        if not ok:
            print(proc.stderr[-4000:])
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
