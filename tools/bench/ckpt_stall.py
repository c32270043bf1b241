"""Training stall per checkpoint: how long the step loop is blocked by a save, synchronous vs asynchronous.

One process trains a plain MLP (``--layers`` × Linear(width, width), AdamW) and saves through
lerobot_ckpt's public API, alternating the two kinds in one run so machine noise hits both:
``save_checkpoint`` (sync) and ``AsyncCheckpointer.save`` (async) into two run directories. The
stall of a save is every second the loop spends outside its steps because of it: the whole call
for a sync save; for an async save the call (the CPU snapshot) plus any wait for it at the next
save point (none when the background write finished within ``--steps`` steps, which the script
reports). Also printed: the background write's own duration, and the loop's step time while a
write is in flight vs without one (on a shared 2-core machine the writer competes with training
for the CPU; on a GPU machine the step does not).

Usage: uv run python tools/bench/ckpt_stall.py [--width 2048] [--layers 12] [--rounds 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lerobot_ckpt import AsyncCheckpointer, RunInfo, TrainingObjects, save_checkpoint
from torch import nn


def _train_steps(model, opt, n: int, width: int) -> list[tuple[float, float]]:
    """``n`` steps; returns each step's (start, end) in ``time.monotonic()`` (CompletedSave's clock)."""
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        model(torch.randn(4, width)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((t0, time.monotonic()))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="training steps between two saves")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temporary directory)"
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    objects, run = TrainingObjects(model=model, optimizer=opt), RunInfo(world_size=1, batch_size=4)
    n_params = sum(p.numel() for p in model.parameters())
    root = args.dir or Path(tempfile.mkdtemp(prefix="ckpt_stall_"))
    saver = AsyncCheckpointer.create()
    step = 0
    _train_steps(model, opt, 5, args.width)  # warm-up (the first AdamW step allocates its state)
    step += 5

    sync_stall, async_call, async_wait, background, steps_idle, steps_writing = [], [], [], [], [], []
    for _ in range(args.rounds):
        step += 1
        t0 = time.monotonic()
        save_checkpoint(root / "sync", step, run=run, objects=objects)
        sync_stall.append(time.monotonic() - t0)
        steps_idle += [b - a for a, b in _train_steps(model, opt, args.steps, args.width)]
        step += args.steps

        step += 1
        t0 = time.monotonic()
        saver.save(root / "async", step, run=run, objects=objects)
        async_call.append(time.monotonic() - t0)
        steps = _train_steps(model, opt, args.steps, args.width)
        step += args.steps
        t0 = time.monotonic()
        done = saver.wait()  # the next save point: whatever is left of the write blocks the loop here
        async_wait.append(time.monotonic() - t0)
        background.append(done.committed - done.snapshot_done)
        steps_writing += [b - a for a, b in steps if b <= done.committed]
        steps_idle += [b - a for a, b in steps if a >= done.committed]
    saver.close()

    size = sum(
        p.stat().st_size for p in (root / "sync" / "checkpoints" / "last").resolve().rglob("*") if p.is_file()
    )
    med = statistics.median
    print(
        f"model: {args.layers} x Linear({args.width}, {args.width}), {n_params:,} parameters; checkpoint "
        f"{size / 2**20:.0f} MiB (weights + AdamW state); {args.rounds} rounds, "
        f"{args.steps} steps between saves"
    )
    print(f"{'':34}{'median':>9}{'min':>9}{'max':>9}")
    rows = [
        ("sync: stall per checkpoint", sync_stall),
        ("async: stall per checkpoint", [c + w for c, w in zip(async_call, async_wait, strict=True)]),
        ("  of which snapshot (save call)", async_call),
        ("  of which wait at next save", async_wait),
        ("async: background write + commit", background),
    ]
    for name, values in rows:
        print(f"{name:34}{med(values):9.3f}{min(values):9.3f}{max(values):9.3f}  s")
    print(
        f"step time: {med(steps_idle) * 1e3:.1f} ms without a write in flight, "
        f"{med(steps_writing) * 1e3 if steps_writing else float('nan'):.1f} ms while one is "
        f"({len(steps_writing)} steps; the writer shares the CPU cores with the step)"
    )
    print(f"stall ratio async/sync: {med(rows[1][1]) / med(sync_stall):.3f}")
    if args.dir is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
