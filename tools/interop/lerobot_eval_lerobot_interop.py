"""``lerobot-eval`` against LeRobot 0.6.1's own ``lerobot-eval``, on a checkpoint either trainer wrote: the
same checkpoint, flags and env give the same episodes and the same ``eval_info.json``.

    uv run python tools/interop/lerobot_eval_lerobot_interop.py --lerobot-python <LeRobot env>/bin/python

LeRobot's side needs gym-pusht (``lerobot[pusht]``; or ``--lerobot-site DIR``, a directory added to its
``sys.path``, as tools/interop/pusht_eval_lerobot_interop.py takes it).

1. our checkpoint: a tiny ACT (random backbone, ``ACT``) trained one step on the bundled PushT demo
   (``data/lerobot/demo_pusht``) by our ``lerobot-train`` (``lerobot_cli.train.main``, this env).
2. LeRobot's checkpoint: the same flags through LeRobot's own ``python -m lerobot.scripts.lerobot_train``
   (its env; ``--wandb.enable=false``, offline as tools/interop/defaults_lerobot_interop.py runs it:
   ``HF_HUB_OFFLINE=1``, ``HF_HOME`` and ``HF_LEROBOT_HOME`` in the scratch directory).
3. each checkpoint's ``checkpoints/last/pretrained_model/`` evaluated with the same ``EVAL`` flags by our
   ``lerobot-eval`` (``lerobot_cli.eval.main``) and by ``python -m lerobot.scripts.lerobot_eval``
   (``--policy.device=cpu``).
4. compared, per checkpoint: every key of LeRobot's ``eval_info.json`` is in ours (``per_task``,
   ``per_group``, ``overall``, and their metrics' keys), the task group, ``n_episodes``, each episode's
   success exactly, its sum and max reward to ``ATOL``: the two torches (this env's and LeRobot's 2.11)
   round ACT's convolutions differently in the last bits, and gym-pusht turns that into rewards a few 1e-7
   apart. ACT acts deterministically, so every batch must agree, not only the first (a noise-drawing
   policy would match in batch 0 only: ``lerobot_cli.evaluation.run``). Five episodes in batches of two:
   three batches, the last keeping one of its two envs. Each episode's video against LeRobot's of the same
   name: as many frames, the same size, the same scene (lossy encodings: mean absolute difference under
   ``VIDEO_ATOL``). LeRobot also writes a video of the env a last partial batch throws away; ours does not.

Each result line names its checkpoint (``[our checkpoint]``, ``[LeRobot's checkpoint]``). Exit status 0
(``PASS``) means every comparison held for both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

DEMO_PUSHT = Path(__file__).resolve().parents[2] / "data" / "lerobot" / "demo_pusht"  # the bundled demo

ATOL = 1e-4
VIDEO_ATOL = 2.0
N_EPISODES = 5
EVAL = [
    "--env.type=pusht",
    "--env.episode_length=20",
    f"--eval.n_episodes={N_EPISODES}",
    "--eval.batch_size=2",
    "--eval.use_async_envs=false",
    "--seed=1000",
]
ACT = [
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
]
# Both trainers' flags (each adds --output_dir=<work>/<trainer>_run; LeRobot's also --wandb.enable=false).
TRAIN = [
    "--dataset.repo_id=lerobot/demo_pusht",
    f"--dataset.root={DEMO_PUSHT}",
    *ACT,
    "--policy.device=cpu",
    "--policy.push_to_hub=false",
    "--steps=1",
    "--batch_size=2",
    "--num_workers=0",
]


class Failed(Exception):
    """A step that did not run: no comparison for that checkpoint."""


def lerobot(python: str, script: str, argv: list[str], env: dict) -> None:
    """``python -m lerobot.scripts.<script> argv`` in LeRobot's env; its output (progress bars and logs) is
    shown only when it fails, and then raises ``Failed``."""
    proc = subprocess.run(
        [python, "-m", f"lerobot.scripts.{script}", *argv],
        check=False,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise Failed(f"LeRobot's {script} did not run (its output above)")


def train(trainer: str, run: Path, python: str, side_env: dict) -> Path:
    """The tiny ACT trained by ``trainer`` (``ours`` in this process, ``lerobot`` in LeRobot's env) into
    ``run``; returns its last checkpoint's ``pretrained_model/``."""
    if trainer == "lerobot":
        lerobot(python, "lerobot_train", [*TRAIN, "--wandb.enable=false", f"--output_dir={run}"], side_env)
    else:
        from lerobot_cli.train import main as lerobot_train

        if lerobot_train([*TRAIN, f"--output_dir={run}"]) != 0:
            raise Failed("our lerobot-train did not run")
    return run / "checkpoints" / "last" / "pretrained_model"


def compare(mine: dict, theirs: dict) -> list[str]:
    """Every difference, one line each (none: the same eval)."""
    problems = []
    for section in ("per_task", "per_group", "overall"):
        if section not in mine:
            problems.append(f"our eval_info.json has no {section}")
    if problems:
        return problems
    missing = set(theirs["overall"]) - set(mine["overall"])
    missing |= {
        f"per_group.pusht.{k}" for k in set(theirs["per_group"]["pusht"]) - set(mine["per_group"]["pusht"])
    }
    ours_m, their_m = mine["per_task"][0]["metrics"], theirs["per_task"][0]["metrics"]
    missing |= {f"per_task.metrics.{k}" for k in set(their_m) - set(ours_m)}
    problems += [f"our eval_info.json lacks LeRobot's {k}" for k in sorted(missing)]
    if [t["task_group"] for t in mine["per_task"]] != [t["task_group"] for t in theirs["per_task"]]:
        problems.append("task groups differ")
    if mine["overall"]["n_episodes"] != theirs["overall"]["n_episodes"]:
        problems.append(
            f"n_episodes: ours {mine['overall']['n_episodes']}, LeRobot's {theirs['overall']['n_episodes']}"
        )
    if ours_m["successes"] != their_m["successes"]:
        problems.append(f"successes: ours {ours_m['successes']}, LeRobot's {their_m['successes']}")
    for key in ("sum_rewards", "max_rewards"):
        a, b = ours_m[key], their_m[key]
        if len(a) != len(b) or any(abs(x - y) > ATOL for x, y in zip(a, b, strict=False)):
            problems.append(f"{key}: ours {a}, LeRobot's {b}")
    return problems


def decoded(path: Path):
    """The frames of an mp4, (T, H, W, 3) uint8."""
    import av
    import numpy as np

    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def compare_videos(work: Path, n_episodes: int) -> list[str]:
    """Each kept episode's video against LeRobot's of the same name: as many frames (LeRobot's cut at the
    first done), the same size, the same scene (mean absolute difference under ``VIDEO_ATOL`` of 255: both
    are lossy encodings of the env's renders)."""
    problems = []
    for i in range(min(10, n_episodes)):
        name = Path("videos") / "pusht_0" / f"eval_episode_{i}.mp4"
        mine, theirs = decoded(work / "ours" / name), decoded(work / "lerobot" / name)
        if mine.shape != theirs.shape:
            problems.append(f"{name}: ours {mine.shape}, LeRobot's {theirs.shape}")
            continue
        diff = float(abs(mine.astype(float) - theirs.astype(float)).mean())
        if diff > VIDEO_ATOL:
            problems.append(f"{name}: mean absolute difference {diff:.2f} of 255")
    return problems


def evaluate(tag: str, model: Path, out: Path, python: str, side_env: dict) -> list[str]:
    """``model`` evaluated by our ``lerobot-eval`` into ``out/ours`` and LeRobot's into ``out/lerobot``;
    every difference, one line each (none: the same eval). ``tag`` names the checkpoint in what it prints."""
    from lerobot_cli.eval import main as lerobot_eval

    if lerobot_eval([f"--policy.path={model}", *EVAL, f"--output_dir={out / 'ours'}"]) != 0:
        raise Failed("our lerobot-eval did not run")
    argv = [f"--policy.path={model}", "--policy.device=cpu", *EVAL, f"--output_dir={out / 'lerobot'}"]
    lerobot(python, "lerobot_eval", argv, side_env)
    mine = json.loads((out / "ours" / "eval_info.json").read_text())
    theirs = json.loads((out / "lerobot" / "eval_info.json").read_text())
    their_m = theirs["per_task"][0]["metrics"]
    successes = their_m["successes"]
    print(f"{tag} LeRobot's lerobot-eval: sum_rewards {their_m['sum_rewards']}, successes {successes}")
    print(f"{tag} ours:                   sum_rewards {mine['per_task'][0]['metrics']['sum_rewards']}")
    return compare(mine, theirs) + compare_videos(out, N_EPISODES)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lerobot-python", required=True, help="python of an env with lerobot 0.6.x")
    parser.add_argument(
        "--lerobot-site", help="a directory with gym-pusht for LeRobot's python (if not in it)"
    )
    args = parser.parse_args()
    env = {**os.environ, "SDL_VIDEODRIVER": os.environ.get("SDL_VIDEODRIVER", "dummy")}
    side_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # our packages stay out of LeRobot's env
    if args.lerobot_site:
        side_env["PYTHONPATH"] = args.lerobot_site
    probe = subprocess.run(
        [args.lerobot_python, "-c", "import gym_pusht, lerobot"],
        check=False,
        env=side_env,
        capture_output=True,
    )
    if probe.returncode != 0:
        print("FAIL: LeRobot's env has no gym-pusht (install lerobot[pusht] there, or pass --lerobot-site)")
        return 1
    os.environ.update(env)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        side_env.update(HF_HUB_OFFLINE="1", HF_HOME=str(work / "hf"), HF_LEROBOT_HOME=str(work / "home"))
        for tag, trainer in (("[our checkpoint]", "ours"), ("[LeRobot's checkpoint]", "lerobot")):
            try:
                model = train(trainer, work / f"{trainer}_run", args.lerobot_python, side_env)
                problems = evaluate(tag, model, work / f"{trainer}_eval", args.lerobot_python, side_env)
            except Failed as failed:
                print(f"FAIL: {tag} {failed}")
                ok = False
                continue
            for line in problems:
                print(f"DIFFERENT: {tag} {line}")
            ok &= not problems
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
