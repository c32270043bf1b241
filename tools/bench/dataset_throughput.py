"""Items/s of LeRobotDataset through a torch DataLoader: state-only vs video, num_workers 0 vs 2.

Both datasets are the demo reaching task written into a temporary directory (the video one with its 64x64
camera, the state-only one without), read with an ACT-style action window. Run::

    uv run python tools/bench/dataset_throughput.py [--batches 150] [--chunk_size 10]

Start-up (worker fork, first batch) is reported separately and not counted in items/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lerobot_cli.datasets import LeRobotDataset
from make_demo_dataset import build


def measure(dataset: LeRobotDataset, workers: int, batch_size: int, batches: int) -> tuple[float, float]:
    """(start-up seconds, items/s over ``batches`` batches after the first), reshuffling as epochs end."""
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        generator=generator,
        persistent_workers=workers > 0,
        drop_last=True,
    )
    begin = time.perf_counter()
    iterator, seen = iter(loader), 0
    next(iterator)
    startup = time.perf_counter() - begin
    begin = time.perf_counter()
    while seen < batches:
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(loader)
            continue
        seen += 1
        assert len(batch["index"]) == batch_size
    return startup, seen * batch_size / (time.perf_counter() - begin)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=150, help="timed batches per configuration")
    parser.add_argument("--chunk_size", type=int, default=10, help="ACT action window (frames)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        roots = {
            "state-only": build(Path(tmp) / "state", camera=False),
            "video 64x64": build(Path(tmp) / "video", camera=True),
        }
        print(
            f"batch_size={args.batch_size}, action window={args.chunk_size} frames, "
            f"{args.batches} timed batches per row, torch threads=1"
        )
        print(f"{'dataset':<12} {'frames':>6} {'workers':>7} {'start-up s':>10} {'items/s':>9}")
        for name, root in roots.items():
            probe = LeRobotDataset(root)
            deltas = {"action": [i / probe.fps for i in range(args.chunk_size)]}
            for workers in args.workers:
                dataset = LeRobotDataset(root, delta_timestamps=deltas)
                startup, rate = measure(dataset, workers, args.batch_size, args.batches)
                print(f"{name:<12} {len(dataset):>6} {workers:>7} {startup:>10.2f} {rate:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
