"""DataLoader items/s on a real-resolution video dataset: our LeRobotDataset beside LeRobot 0.6.1's.

The dataset is one written by LeRobot 0.6.1's own writer (3 cameras 480x640, AV1, 30 fps), made with
``tools/bench/make_robot_video_dataset.py`` in LeRobot's environment (``tools/interop/ci.sh`` builds it)::

    ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python tools/bench/make_robot_video_dataset.py \\
        --root /tmp/robot_av1
    uv run --frozen python tools/bench/video_loader.py [--root /tmp/robot_av1] \\
        [--windows act diffusion pi0] [--workers 1] [--batches 40] [--rounds 2] [--batch-size 8] \\
        [--lerobot-python PATH]

Each measurement is one fresh subprocess (this workspace's interpreter for ours, LeRobot's for LeRobot's)
that builds the dataset and a DataLoader (shuffled with a seeded generator, ``--workers`` workers,
persistent, default prefetch, drop_last), takes the first batch as start-up (reported with the dataset's
construction; the imports of torch and the dataset's package apart), times the next ``--batches``
batches (wrapping epochs) and prints one JSON line. Sides alternate (ours, LeRobot, ours, ...) for
``--rounds`` rounds per window and the ratio is the median of each round's ours/LeRobot, so the noise of a
small shared machine hits both sides alike. With the default single worker the figure is per worker.

Windows (delta_timestamps, fps from meta/info.json):
  act        action: 50 frames ahead; cameras and state one frame
  diffusion  state and every camera: [-1/fps, 0]; action: frames -1 .. 14
  pi0        as act, plus a 224x224 resize-with-pad (bilinear to fit, centred zero pad) of every camera of
             the batch in the main process, the same code on both sides, timed as part of the batch

Both sides are asked for cameras as uint8 CHW (LeRobot's training factory passes ``return_uint8=True``; ours
when its constructor has that keyword, else its float32 in [0, 1]). LeRobot decodes with PyAV
(``video_backend="pyav"``): torchcodec needs a system FFmpeg, which this machine lacks. Before timing a
window, both sides decode the same few indices and the largest per-camera pixel difference is printed
(ours float*255 rounded when it gives float); it should be 0, as both decode with PyAV.

Peak RSS is VmHWM from /proc/<pid>/status: each DataLoader worker's (read by the child before it shuts the
loader down; a forked worker's RSS includes the pages it shares with its parent) and the main process's
(which counts the shared-memory pages of the batches it reads: in the pi0 window, every camera pixel).
The child imports nothing from this repository on LeRobot's side: only torch, numpy and the dataset class.

``--long-root`` names the same dataset made many times longer (``tools/bench/repeat_dataset.py``: episodes
repeated, videos hard-linked), and adds a last table: each side's peak RSS per worker and of the main
process in the ACT window on ``--root`` and on the long copy, for memory that must not grow with the
number and length of episodes.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_ROOT = Path("/tmp/robot_av1")
DEFAULT_LEROBOT_PYTHON = Path("~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python").expanduser()
REPO_ID = "bench/robot_video"  # what make_robot_video_dataset.py names it; LeRobot wants one with root=
WINDOWS = ("act", "diffusion", "pi0")
SIDES = ("ours", "lerobot")
PI0_SIZE = 224
MEDIANS = ("items_per_s", "items_per_cpu_s", "startup_s", "import_s")
PEAKS = ("worker_peak_rss", "main_peak_rss")
RESULT = "RESULT "  # the child's JSON line starts with it (libraries may print to stdout too)


# ----------------------------------------------------------------------------------------------- child
def _info(root: Path) -> tuple[float, list[str], dict]:
    info = json.loads((root / "meta" / "info.json").read_text())
    cameras = [k for k, f in info["features"].items() if f.get("dtype") in ("video", "image")]
    return float(info["fps"]), cameras, info


def window_deltas(window: str, fps: float, cameras: list[str]) -> dict[str, list[float]]:
    if window in ("act", "pi0"):
        return {"action": [i / fps for i in range(50)]}
    if window == "diffusion":
        two = [-1 / fps, 0.0]
        action = [i / fps for i in range(-1, 15)]
        return {"observation.state": two, **{cam: two for cam in cameras}, "action": action}
    raise ValueError(f"unknown window {window!r} (choose from {', '.join(WINDOWS)})")


def _dataset_class(side: str) -> type:
    """The side's LeRobotDataset, imported here, in the child."""
    if side == "ours":
        from lerobot_cli.datasets import LeRobotDataset
    else:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    return LeRobotDataset


def _build(side: str, LeRobotDataset: type, root: Path, deltas: dict):
    """(dataset, how cameras come back) for a side."""
    if side == "ours":
        if "return_uint8" in inspect.signature(LeRobotDataset).parameters:
            return LeRobotDataset(root=root, delta_timestamps=deltas, return_uint8=True), "return_uint8=True"
        return LeRobotDataset(root=root, delta_timestamps=deltas), "float32 (no return_uint8 keyword)"
    dataset = LeRobotDataset(
        REPO_ID, root=root, delta_timestamps=deltas, video_backend="pyav", return_uint8=True
    )
    return dataset, "return_uint8=True, video_backend=pyav"


def _status(pid: int | str, field: str) -> int | None:
    """A byte count of /proc/<pid>/status (VmHWM, RssAnon, ...), None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _hwm(pid: int | str = "self") -> int | None:
    """Peak RSS (VmHWM) of a process in bytes, None when it cannot be read."""
    return _status(pid, "VmHWM")


def resize_with_pad(images, size: int = PI0_SIZE):
    """(..., C, H, W) uint8 or float in [0, 1] -> float32 (..., C, size, size): bilinear resize to fit, then a
    centred zero pad (openpi's convention)."""
    import torch
    import torch.nn.functional as F

    lead, (c, h, w) = images.shape[:-3], images.shape[-3:]
    x = images.reshape(-1, c, h, w)
    x = x.to(torch.float32).div_(255.0) if x.dtype == torch.uint8 else x.to(torch.float32)
    scale = min(size / h, size / w)
    rh, rw = round(h * scale), round(w * scale)
    x = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False)
    ph, pw = size - rh, size - rw
    x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=0.0)
    return x.reshape(*lead, c, size, size)


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) a process has used, None when unreadable: items per
    worker CPU-second is the per-core figure, fair between a one-thread decoder and a threaded one."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _workers_cpu_s(iterator) -> float | None:
    used = [_cpu_s(w.pid) for w in getattr(iterator, "_workers", [])]
    return sum(used) if used and None not in used else None


def _versions() -> dict:
    import torch

    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    try:
        import av

        out["av"] = av.__version__
    except ImportError:
        out["av"] = None
    return out


def child_time(args: argparse.Namespace) -> dict:
    begin = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    fps, cameras, _ = _info(args.root)
    deltas = window_deltas(args.window, fps, cameras)
    cls = _dataset_class(args.side)
    built = time.perf_counter()
    import_s = built - begin  # torch and the side's package: paid once per process, reported apart
    dataset, mode = _build(args.side, cls, args.root, deltas)
    build_s = time.perf_counter() - built
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        drop_last=True,
    )
    post = args.window == "pi0"
    first = time.perf_counter()
    iterator = iter(loader)
    batch = next(iterator)
    dtype = str(batch[cameras[0]].dtype) if cameras else None
    if post:
        for cam in cameras:
            batch[cam] = resize_with_pad(batch[cam])
    first_s = time.perf_counter() - first
    cpu_before = _workers_cpu_s(iterator)
    seen, begin = 0, time.perf_counter()
    while seen < args.batches:
        try:
            batch = next(iterator)
        except StopIteration:  # a new epoch: the same persistent workers, reshuffled
            iterator = iter(loader)
            continue
        if post:
            for cam in cameras:
                batch[cam] = resize_with_pad(batch[cam])
        seen += 1
    elapsed = time.perf_counter() - begin
    cpu_after = _workers_cpu_s(iterator)
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    pids = [w.pid for w in getattr(iterator, "_workers", [])]
    workers = [_hwm(pid) for pid in pids]
    # the RSS of the first worker at the end, by kind: private, shared memory, file-backed pages
    kinds = {k: _status(pids[0], k) if pids else None for k in ("RssAnon", "RssShmem", "RssFile")}
    result = {
        "side": args.side,
        "window": args.window,
        "mode": mode,
        "camera_dtype": dtype,
        "items_per_s": seen * args.batch_size / elapsed,
        # the epoch restarts above count with the persistent workers' CPU time, as in training
        "items_per_cpu_s": seen * args.batch_size / cpu if cpu else None,
        "timed_s": elapsed,
        "import_s": import_s,
        "build_s": build_s,
        "first_batch_s": first_s,
        "startup_s": build_s + first_s,
        "worker_peak_rss": max((w for w in workers if w is not None), default=None),
        "main_peak_rss": _hwm(),
        "worker_rss_kinds": kinds,
        "frames": len(dataset),
        **_versions(),
    }
    del iterator, loader
    return result


def child_check(args: argparse.Namespace) -> dict:
    """Decode ``args.indices`` in this process and save every tensor of the items to ``args.out`` (cameras as
    uint8: ours float*255 rounded when it gives float)."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    fps, cameras, _ = _info(args.root)
    deltas = window_deltas(args.window, fps, cameras)
    dataset, mode = _build(args.side, _dataset_class(args.side), args.root, deltas)
    arrays = {}
    for index in args.indices:
        item = dataset[index]
        for key, value in item.items():
            if not isinstance(value, torch.Tensor):
                continue
            if key in cameras and value.is_floating_point():
                value = value.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)
            arrays[f"{index}@{key}"] = value.numpy()
    np.savez(args.out, **arrays)
    result = {"side": args.side, "mode": mode, **_versions()}
    if args.side == "lerobot":
        try:
            import torchcodec.decoders  # noqa: F401

            result["torchcodec"] = "loads"
        except Exception as err:  # noqa: BLE001 (a RuntimeError listing the FFmpeg versions it tried, usually)
            result["torchcodec"] = f"cannot load ({type(err).__name__}: {str(err).strip().splitlines()[0]})"
    return result


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="one measurement (run by the parent)")
    parser.add_argument("task", choices=("time", "check"))
    parser.add_argument("side", choices=SIDES)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--window", choices=WINDOWS, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--indices", type=int, nargs="*", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = child_time(args) if args.task == "time" else child_check(args)
    print(RESULT + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- parent
def run_child(python: Path, child_args: list[str], timeout: float) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [str(python), str(Path(__file__).resolve()), "--child", *child_args]
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len(RESULT) :])


def check_window(args, window: str, cameras: list[str], indices: list[int], pythons: dict) -> dict:
    """Both sides' items at ``indices``; prints the largest difference per camera (and any other tensor)."""
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        infos, arrays = {}, {}
        for side in SIDES:
            out = Path(tmp) / f"{side}.npz"
            child = ["check", side, "--root", str(args.root), "--window", window, "--out", str(out)]
            infos[side] = run_child(pythons[side], [*child, "--indices", *map(str, indices)], args.timeout)
            with np.load(out) as data:
                arrays[side] = {k: data[k] for k in data.files}
    ours, theirs = arrays["ours"], arrays["lerobot"]
    parts, other, problems = [], 0.0, []
    keys = sorted({k.split("@", 1)[1] for k in ours} | {k.split("@", 1)[1] for k in theirs})
    for key in keys:
        worst = 0.0
        for index in indices:
            name = f"{index}@{key}"
            if name not in ours or name not in theirs:
                problems.append(f"{key} only in {'ours' if name in ours else 'LeRobot'}'s items")
                break
            a, b = ours[name], theirs[name]
            if a.shape != b.shape:
                problems.append(f"{key} shape {a.shape} (ours) vs {b.shape} (LeRobot) at index {index}")
                break
            if a.size:
                worst = max(worst, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()))
        if key in cameras:
            parts.append(f"{key.removeprefix('observation.images.')}={worst:g}")
            if worst:
                problems.append(f"{key}: frames differ by up to {worst:g} (of 255)")
        else:
            other = max(other, worst)
    print(
        f"  check {window}: indices {indices}, max |ours - LeRobot| per camera: {', '.join(parts)}; "
        f"other tensors: {other:g}"
    )
    for problem in dict.fromkeys(problems):
        print(f"  CHECK MISMATCH ({window}): {problem}")
    return infos


def _median(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _per_cpu(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


def cpu_ratio(med: dict) -> str:
    """ours/LeRobot of the medians of items per worker CPU-second ('?' when unknown)."""
    ours, theirs = med["ours"]["items_per_cpu_s"], med["lerobot"]["items_per_cpu_s"]
    return "?" if not ours or not theirs else f"{ours / theirs:.2f}"


def _peak(values) -> int | None:
    return max((v for v in values if v is not None), default=None)


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def pair(a: str, b: str, width: int) -> str:
    return f"{a + ' / ' + b:>{width}}"


def time_window(args, root: Path, window: str, pythons: dict, rounds: int) -> dict[str, list[dict]]:
    """``rounds`` timed measurements per side on ``root``, sides alternating; each printed as it ends."""
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for r in range(rounds):
        for side in SIDES:
            child = [
                "time", side, "--root", str(root), "--window", window,
                "--workers", str(args.workers), "--batches", str(args.batches),
                "--batch-size", str(args.batch_size),
            ]  # fmt: skip
            res = run_child(pythons[side], child, args.timeout)
            runs[side].append(res)
            print(
                f"  {window} round {r + 1} {side:<7}: {res['items_per_s']:6.1f} items/s "
                f"({_per_cpu(res['items_per_cpu_s'])} per worker CPU-s), start-up "
                f"{res['startup_s']:.2f} s (build {res['build_s']:.2f}, "
                f"first batch {res['first_batch_s']:.2f}), "
                f"imports {res['import_s']:.1f} s, cameras {res['camera_dtype']}, worker peak "
                f"{mib(res['worker_peak_rss'])} MiB, main peak {mib(res['main_peak_rss'])} MiB",
                flush=True,
            )
    return runs


def memory_table(args, pythons: dict, short: dict[str, list[dict]] | None) -> None:
    """Peak RSS in the ACT window on --root and on --long-root, per side (the max over rounds)."""
    if short is None:
        short = time_window(args, args.root, "act", pythons, args.rounds)
    long = time_window(args, args.long_root, "act", pythons, args.rounds)
    _, _, info = _info(args.long_root)
    frames = {"short": short["ours"][0]["frames"], "long": long["ours"][0]["frames"]}
    print()
    print(
        f"memory, act window: {frames['short']} frames ({args.root}) vs {frames['long']} frames "
        f"({info['total_episodes']} episodes, {args.long_root}); peak RSS in MiB, max over rounds"
    )
    print(
        f"{'side':<8} {'worker short':>12} {'worker long':>12} {'growth':>7} "
        f"{'main short':>11} {'main long':>10}   worker's RSS at the end, short -> long: "
        "private / shared memory / files"
    )
    for side in SIDES:
        ws, wl = (
            _peak(r["worker_peak_rss"] for r in short[side]),
            _peak(r["worker_peak_rss"] for r in long[side]),
        )
        ms, ml = _peak(r["main_peak_rss"] for r in short[side]), _peak(r["main_peak_rss"] for r in long[side])
        growth = "-" if ws is None or wl is None else f"{(wl - ws) / 2**20:+.0f}"
        kinds = [
            " / ".join(mib(run[side][0]["worker_rss_kinds"][k]) for k in ("RssAnon", "RssShmem", "RssFile"))
            for run in (short, long)
        ]
        print(
            f"{side:<8} {mib(ws):>12} {mib(wl):>12} {growth:>7} {mib(ms):>11} {mib(ml):>10}   "
            f"{kinds[0]} -> {kinds[1]}"
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--lerobot-python", type=Path, default=DEFAULT_LEROBOT_PYTHON)
    parser.add_argument("--windows", nargs="+", choices=WINDOWS, default=list(WINDOWS))
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers (1: per worker)")
    parser.add_argument("--batches", type=int, default=40, help="timed batches per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="measurements per side and window, alternating")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per child process")
    parser.add_argument("--long-root", type=Path, help="--root made longer (repeat_dataset.py): RSS table")
    args = parser.parse_args(argv)
    if not (args.root / "meta" / "info.json").is_file():
        parser.error(f"{args.root} has no meta/info.json (tools/bench/make_robot_video_dataset.py writes it)")
    if args.long_root is not None and not (args.long_root / "meta" / "info.json").is_file():
        parser.error(f"{args.long_root} has no meta/info.json (tools/bench/repeat_dataset.py writes it)")
    if not args.lerobot_python.is_file():
        parser.error(f"no LeRobot interpreter at {args.lerobot_python} (tools/interop/ci.sh builds it)")
    pythons = {"ours": Path(sys.executable), "lerobot": args.lerobot_python}
    fps, cameras, info = _info(args.root)
    frames = int(info["total_frames"])
    shapes = sorted({"x".join(map(str, info["features"][c]["shape"][:2])) for c in cameras})
    codecs = sorted({str(info["features"][c].get("info", {}).get("video.codec")) for c in cameras})
    print(
        f"{args.root}: {info['total_episodes']} episodes, {frames} frames at {fps:g} fps, "
        f"{len(cameras)} cameras {'/'.join(shapes)} {'/'.join(codecs)}"
    )
    print(
        f"batch_size={args.batch_size}, workers={args.workers}, {args.batches} timed batches per "
        f"measurement, {args.rounds} rounds per side, torch threads=1 in the main process"
    )
    indices = sorted({0, min(149, frames - 1), min(150, frames - 1), frames // 2 + 7, frames - 1})
    rows, started, act_runs = [], time.perf_counter(), None
    for window in args.windows:
        infos = check_window(args, window, cameras, indices, pythons)
        if window == args.windows[0]:
            for side, name in (("ours", "ours   "), ("lerobot", "LeRobot")):
                i = infos[side]
                extra = f"; torchcodec {i['torchcodec']}" if "torchcodec" in i else ""
                versions = f"python {i['python']}, torch {i['torch']}, PyAV {i['av']}"
                print(f"  {name}: {i['mode']} ({versions}){extra}")
        runs = time_window(args, args.root, window, pythons, args.rounds)
        if window == "act":
            act_runs = runs
        ratios = [o["items_per_s"] / t["items_per_s"] for o, t in zip(runs["ours"], runs["lerobot"])]
        med = {s: {k: _median(x[k] for x in runs[s]) for k in MEDIANS} for s in SIDES}
        peak = {s: {k: _peak(x[k] for x in runs[s]) for k in PEAKS} for s in SIDES}
        rows.append((window, med, statistics.median(ratios), peak))
    print()
    print(
        "medians over rounds; ratio: median of each round's ours/LeRobot; items/CPU-s: items per second of "
        "the workers' CPU time (per core); pairs: ours / LeRobot; peak: max"
    )
    print(
        f"{'window':<10} {'ours items/s':>12} {'LeRobot items/s':>15} {'ratio':>6} "
        f"{'items/CPU-s':>13} {'ratio':>6} {'start-up s':>13} "
        f"{'imports s':>11} {'worker peak MiB':>17} {'main peak MiB':>15}"
    )
    for window, med, ratio, peak in rows:
        print(
            f"{window:<10} {med['ours']['items_per_s']:>12.1f} {med['lerobot']['items_per_s']:>15.1f} "
            f"{ratio:>6.2f} "
            + pair(_per_cpu(med["ours"]["items_per_cpu_s"]), _per_cpu(med["lerobot"]["items_per_cpu_s"]), 13)
            + f" {cpu_ratio(med):>6} "
            + pair(f"{med['ours']['startup_s']:.2f}", f"{med['lerobot']['startup_s']:.2f}", 13)
            + " "
            + pair(f"{med['ours']['import_s']:.1f}", f"{med['lerobot']['import_s']:.1f}", 11)
            + " "
            + pair(mib(peak["ours"]["worker_peak_rss"]), mib(peak["lerobot"]["worker_peak_rss"]), 17)
            + " "
            + pair(mib(peak["ours"]["main_peak_rss"]), mib(peak["lerobot"]["main_peak_rss"]), 15)
        )
    if args.long_root is not None:
        memory_table(args, pythons, act_runs)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print(
        f"machine: {os.cpu_count()} cores ({affinity} usable by this process); whole run "
        f"{time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
