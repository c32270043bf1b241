"""Wall time of one simulation eval inside ``lerobot-train`` on one process vs N ranks, measured side by
side in one run (these machines are noisy): the same episodes (the plan deals LeRobot's batches to the
ranks), the same tiny Diffusion Policy on the bundled PushT demo, so the ratio is what splitting the
episodes over the ranks buys. LeRobot 0.6.1 evaluates on the main process only, at the one-process time
whatever the number of ranks.

Each configuration is one ``lerobot-train`` run (1 step, then the eval, no checkpoint); the time is its
``eval/eval_s`` record (the main rank's wall time from the first env reset to the results gathered). The
runs alternate one process / N ranks ``--repeats`` times and the medians are compared.

Usage: uv run python tools/bench/sim_eval_ranks.py [--nproc 2] [--episodes 8] [--batch-size 2]
       [--episode-length 100] [--layout ddp|fsdp] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(Path(sys.executable).parent / "lerobot-train")
TINY_DIFFUSION = [
    "--policy.type=diffusion",
    "--policy.pretrained_backbone_weights=null",
    "--policy.use_group_norm=true",
    "--policy.down_dims=[16,32]",
    "--policy.horizon=8",
    "--policy.n_action_steps=4",
    "--policy.spatial_softmax_num_keypoints=8",
    "--policy.diffusion_step_embed_dim=16",
    "--policy.num_train_timesteps=20",
    "--policy.push_to_hub=false",
]


def eval_seconds(nproc: int, flags: list[str], out: Path) -> float:
    launcher = (
        [TRAIN]
        if nproc == 1
        else [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", TRAIN]
    )
    res = subprocess.run(
        [*launcher, *flags, f"--output_dir={out}"], check=False, capture_output=True, text=True, timeout=3600
    )
    if res.returncode != 0:
        raise SystemExit(f"run failed ({nproc} process(es)):\n{res.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (record,) = [r for r in records if "eval/eval_s" in r]
    return record["eval/eval_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--episode-length", type=int, default=100)
    parser.add_argument("--layout", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    demo = REPO / "data" / "lerobot" / "demo_pusht"
    flags = [
        "--dataset.repo_id=lerobot/demo_pusht",
        f"--dataset.root={demo}",
        "--num_workers=0",
        *TINY_DIFFUSION,
        "--env.type=pusht",
        f"--env.episode_length={args.episode_length}",
        f"--eval.n_episodes={args.episodes}",
        f"--eval.batch_size={args.batch_size}",
        "--eval.use_async_envs=false",
        "--env_eval_freq=1",
        "--steps=1",
        "--batch_size=2",
        "--save_checkpoint=false",
    ]
    sharded = ["--parallelism.dp_shard=" + str(args.nproc)] if args.layout == "fsdp" else []
    times: dict[int, list[float]] = {1: [], args.nproc: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            times[1].append(eval_seconds(1, flags, Path(tmp) / f"one_{r}"))
            times[args.nproc].append(eval_seconds(args.nproc, flags + sharded, Path(tmp) / f"many_{r}"))
            one, many = times[1][-1], times[args.nproc][-1]
            print(f"repeat {r}: 1 process {one:.2f} s, {args.nproc} ranks {many:.2f} s")
    one, many = statistics.median(times[1]), statistics.median(times[args.nproc])
    batches = -(-args.episodes // args.batch_size)
    print(
        f"{args.episodes} episodes x {args.episode_length} steps in {batches} batches of {args.batch_size} "
        f"({args.layout}): 1 process {one:.2f} s, {args.nproc} ranks {many:.2f} s; "
        f"ratio {many / one:.2f} (ideal {(-(-batches // args.nproc)) / batches:.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
