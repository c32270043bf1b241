"""Steps/s of `lerobot-train` vs a bare PyTorch loop on the same model, data and batch (target ≥ 0.97).

Both sides train the same small ACT on the bundled demo dataset with batch 8, one process, no workers.
The bare loop is what a user would write by hand (DataLoader → normalize → forward → backward → clip →
AdamW step); `lerobot-train` adds the sampler, hooks, metrics, progress and JSONL. Both start from the
same seed and use the optimizer the resolved config gives `lerobot-train` (ACT's preset: AdamW, its lr,
betas, eps, weight decay and grad-clip norm), so they follow the same kind of trajectory and the ratio
measures the loop, not a different workload. Runs alternate (bare, ours, bare, ours, ...) so machine
noise hits both; the ratio of medians is printed, and each round's own ratio shows the spread (on a
shared 2-core machine one process-to-process swing of ±10% is common, so use several rounds).

Usage: uv run python tools/bench/loop_overhead.py [--steps 60] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
POLICY = [
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=128",
    "--policy.dim_feedforward=512",
    "--policy.chunk_size=20",
    "--policy.n_action_steps=20",
    "--policy.dropout=0.0",
]
WARMUP = 10


def ours(steps: int) -> float:
    """Mean seconds per loop step after warm-up, from the timestamps of lerobot-train's metric lines."""
    out = Path(tempfile.mkdtemp()) / "run"
    cmd = [
        shutil.which("lerobot-train"),
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--policy.type=act",
        *POLICY,
        f"--steps={steps}",
        "--batch_size=8",
        "--num_workers=0",
        f"--log_freq={WARMUP}",
        "--save_checkpoint=false",
        f"--output_dir={out}",
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    # Logged every WARMUP steps (a user's log_freq, not every step): seconds per step between the first
    # log after warm-up and the last one.
    times = [json.loads(line)["time_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out.parent)
    return (times[-1] - times[0]) / (WARMUP * (len(times) - 1))


def bare(steps: int) -> float:
    """The same work in a hand-written loop, in a fresh process like ours."""
    # Left as written: ruff format breaks the line inside {...!r}, which Python 3.11 rejects.
    # fmt: off
    code = f"""
import time, statistics, torch
from torch.utils.data import DataLoader
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.workload import build_workload
from lerobot_cli.seeding import set_seed
cfg = build_train_config(split_argv({["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}",
                                      "--policy.type=act", *POLICY]!r}).flags).config.finalized()
o = cfg.optimizer
assert o.type == "adamw" and o.grad_clip_norm, o
set_seed(cfg.seed)  # what lerobot-train does before building the workload
w = build_workload(cfg, device="cpu")
policy, pre = w.policy, w.preprocessor
opt = torch.optim.AdamW(policy.get_optim_params(), lr=o.lr, betas=o.betas, eps=o.eps,
                        weight_decay=o.weight_decay)
loader = DataLoader(w.dataset, batch_size=8, shuffle=True, num_workers=0, drop_last=True)
it, stamps = iter(loader), []
for step in range({steps}):
    try:
        batch = next(it)
    except StopIteration:
        it = iter(loader); batch = next(it)
    loss, _ = policy(pre(batch))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), o.grad_clip_norm)
    opt.step(); opt.zero_grad(set_to_none=True)
    float(loss.detach())
    stamps.append(time.perf_counter())
print((stamps[-1] - stamps[{WARMUP} - 1]) / (len(stamps) - {WARMUP}))
"""
    # fmt: on
    proc = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO)
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    b_times, o_times = [], []
    for r in range(args.rounds):
        b_times.append(bare(args.steps))
        o_times.append(ours(args.steps))
        print(
            f"round {r + 1}: bare {1 / b_times[-1]:.2f} steps/s, lerobot-train {1 / o_times[-1]:.2f} steps/s "
            f"(ratio {b_times[-1] / o_times[-1]:.3f})",
            flush=True,
        )
    b, o = statistics.median(b_times), statistics.median(o_times)
    print(f"bare loop:     {1 / b:.2f} steps/s ({b * 1000:.1f} ms/step)")
    print(f"lerobot-train: {1 / o:.2f} steps/s ({o * 1000:.1f} ms/step)")
    print(
        f"ratio lerobot-train / bare: {b / o:.3f} (target ≥ 0.97); median of round ratios "
        f"{statistics.median(bt / ot for bt, ot in zip(b_times, o_times, strict=True)):.3f}"
    )


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")
