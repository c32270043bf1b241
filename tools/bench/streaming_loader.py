"""Streaming (``--dataset.streaming=true``) beside local map-style reading, on a real-resolution dataset.

The dataset is LeRobot 0.6.1's own writing (3 cameras 480x640, AV1, 30 fps; see video_loader.py for how it is
made). A loopback Hub (``tools/hub_server.py``, a separate process) serves it with ``--latency-ms`` added to
every response (a network round trip), and the streaming side reads it through the real ``huggingface_hub``
client (``HF_ENDPOINT`` pointed at the server): range reads of the parquet row groups and video packets its
episodes need, a ``--cache-mb`` block cache per reader, nothing downloaded but ``meta/``::

    uv run --frozen python tools/bench/streaming_loader.py [--root /tmp/robot_av1] [--latency-ms 20] \\
        [--workers 1] [--batches 40] [--rounds 2] [--batch-size 8] [--window act] [--long-root DIR]

Sides, each measured in a fresh subprocess, alternating for ``--rounds`` rounds:
  map     our ``LeRobotDataset`` from the local directory, a shuffled DataLoader (persistent workers):
          what a run reads without streaming
  stream  ``StreamingDataSource`` over ``StreamedDataset``/``EpisodeReader`` from the loopback Hub
  local   the same streaming source on the local directory (no network): the cost of the order alone

Each child takes one batch as start-up, then times ``--batches`` batches and reports items/s, the workers'
peak RSS (VmHWM of its child processes) and, for ``stream``, the requests and bytes fetched. The ratio
printed is the median over rounds of stream/map (and local/map) items/s; the issue's target is
stream >= 0.8x map at 20 ms.

``--long-root``: the same dataset made 8x longer (``tools/bench/repeat_dataset.py --times 8``), served
too: the streaming workers' peak RSS on 1x and 8x (memory must not grow with the dataset).

``--sampler``: the mixture sampler's cost per batch beside the plain sharded sampler's (microseconds per
batch of 8 over 20,000 batches), against a step's time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the same dataset facts, windows and /proc readings as the map-style loader benchmark beside it
from video_loader import _info, _status, mib, window_deltas

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = Path("/tmp/robot_av1")
REPO_ID = "bench/robot_video"
RESULT = "RESULT "
SIDES = ("map", "stream", "local")


# ----------------------------------------------------------------------------------------------- child
def _deltas(root: Path, window: str) -> dict:
    fps, cameras, _ = _info(root)
    return window_deltas(window, fps, cameras)


def _children() -> list[int]:
    """This process's child processes (the DataLoader workers)."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                out.append(int(name))
    return out


def child(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    deltas = _deltas(args.root, args.window)
    begin = time.perf_counter()
    remote = None
    if args.side == "map":
        from lerobot_cli.datasets import LeRobotDataset

        dataset = LeRobotDataset(args.root, delta_timestamps=deltas, return_uint8=True)
        frames = len(dataset)
        batches = torch.utils.data.DataLoader(
            dataset,
            batch_size=args.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
            drop_last=True,
        )
    else:
        from lerobot_cli.datasets.episode_reader import EpisodeReader
        from lerobot_cli.datasets.streamed import StreamedDataset
        from lerobot_trainloop.streaming import StreamingDataSource

        root = args.root
        if args.side == "stream":
            from lerobot_cli.datasets.remote import RemoteDataset

            remote = RemoteDataset(
                f"hf://datasets/{REPO_ID}", cache_dir=args.cache_dir, cache_bytes=args.cache_mb << 20
            )
            root = remote.meta_root
        reader = EpisodeReader(root, None, deltas, return_uint8=True, files=remote)
        dataset = StreamedDataset([reader])
        frames = dataset.num_samples
        batches = StreamingDataSource(
            dataset.read,
            dataset.lengths,
            args.batch_size,
            device=torch.device("cpu"),
            seed=0,
            num_workers=args.workers,
            buffer_size=args.buffer,
            loader_kwargs={"shielded": False},
        )
    build_s = time.perf_counter() - begin
    iterator = iter(batches)
    next(iterator)
    startup_s = time.perf_counter() - begin
    seen, begin = 0, time.perf_counter()
    while seen < args.batches:
        try:
            next(iterator)
        except StopIteration:
            iterator = iter(batches)
            continue
        seen += 1
    elapsed = time.perf_counter() - begin
    workers = [_status(pid, "VmHWM") for pid in _children()]
    return {
        "side": args.side,
        "items_per_s": seen * args.batch_size / elapsed,
        "build_s": build_s,
        "startup_s": startup_s,
        "worker_peak_rss": max((w for w in workers if w), default=None),
        "main_peak_rss": _status("self", "VmHWM"),
        "frames": frames,
    }


def child_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("side", choices=SIDES)
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--window", default="act")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--buffer", type=int, default=1000)
    p.add_argument("--cache-mb", type=int, default=256)
    p.add_argument("--cache-dir", type=Path)
    args = p.parse_args(argv)
    print(RESULT + json.dumps(child(args)), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- parent
class Hub:
    """``tools/hub_server.py`` serving ``root`` in a process of its own."""

    def __init__(self, root: Path, latency_ms: float) -> None:
        cmd = [sys.executable, str(REPO / "tools" / "hub_server.py"), "--root", str(root)]
        cmd += ["--repo-id", REPO_ID, "--latency-ms", str(latency_ms)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise RuntimeError(f"hub_server.py did not start: {self.url!r}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_child(side: str, root: Path, args, hub: Hub | None, tmp: Path) -> dict:
    env = dict(os.environ)
    if hub is not None:
        env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1", HF_HOME=str(tmp / "hf"))
        env.pop("HF_HUB_OFFLINE", None)
    cmd = [sys.executable, __file__, "--child", side, "--root", str(root), "--window", args.window]
    cmd += ["--workers", str(args.workers), "--batches", str(args.batches)]
    cmd += ["--batch-size", str(args.batch_size), "--cache-mb", str(args.cache_mb)]
    cmd += ["--cache-dir", str(tmp / f"cache-{side}-{time.monotonic_ns()}")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout, check=False)
    lines = [x for x in res.stdout.splitlines() if x.startswith(RESULT)]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"{side} child failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def sampler_cost(batches: int = 20000) -> None:
    from lerobot_trainloop.mixture import MixtureBatchSampler
    from lerobot_trainloop.sampler import ShardedBatchSampler

    sizes = [180_000, 60_000, 20_000]
    for name, make in (
        (
            "sharded (one dataset)",
            lambda: ShardedBatchSampler(sum(sizes), 8, dp_rank=0, dp_world_size=1, seed=0),
        ),
        (
            "mixture (3, weighted)",
            lambda: MixtureBatchSampler(sizes, [0.6, 0.3, 0.1], 8, dp_rank=0, dp_world_size=1, seed=0),
        ),
    ):
        sampler = make()
        begin = time.perf_counter()
        it, n = iter(sampler), 0
        while n < batches:
            try:
                next(it)
            except StopIteration:
                it = iter(sampler)
                continue
            sampler.consume(1)
            n += 1
        print(f"  {name:24s} {1e6 * (time.perf_counter() - begin) / batches:7.1f} us per batch of 8")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return child_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    p.add_argument("--long-root", type=Path, help="the dataset 8x longer: streaming RSS on 1x and 8x")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--window", choices=("act", "diffusion"), default="act")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--cache-mb", type=int, default=256)
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--sampler", action="store_true", help="also time the mixture sampler per batch")
    args = p.parse_args(argv)
    results: dict[str, list[dict]] = {s: [] for s in args.sides}
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(args.root, args.latency_ms) if "stream" in args.sides else None
        try:
            for r in range(args.rounds):
                for side in args.sides:
                    got = run_child(side, args.root, args, hub if side == "stream" else None, Path(tmp))
                    results[side].append(got)
                    print(
                        f"round {r + 1} {side:6s} {got['items_per_s']:6.1f} items/s  start-up "
                        f"{got['startup_s']:5.1f} s  worker peak {mib(got['worker_peak_rss'])} MiB",
                        flush=True,
                    )
        finally:
            if hub is not None:
                hub.close()
        print(
            f"\n{args.window} window, {args.workers} worker(s), batch {args.batch_size}, "
            f"{args.latency_ms:g} ms per request for the stream side"
        )
        for side in args.sides:
            med = statistics.median(x["items_per_s"] for x in results[side])
            line = f"  {side:6s} {med:6.1f} items/s"
            if side != "map" and results.get("map"):
                ratios = [a["items_per_s"] / b["items_per_s"] for a, b in zip(results[side], results["map"])]
                line += f"   {statistics.median(ratios):.2f}x map"
            print(line)
        if args.long_root is not None:
            print("\nstreaming workers' peak RSS (MiB), 1x vs the long copy:")
            for root in (args.root, args.long_root):
                hub = Hub(root, args.latency_ms)
                try:
                    got = run_child("stream", root, args, hub, Path(tmp))
                finally:
                    hub.close()
                print(
                    f"  {got['frames']:8d} frames: worker {mib(got['worker_peak_rss'])}, "
                    f"main {mib(got['main_peak_rss'])}, {got['items_per_s']:.1f} items/s"
                )
    if args.sampler:
        print("\nsampler cost per batch:")
        sampler_cost()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
