r"""Check a mixture of three datasets written by LeRobot 0.6.1 itself: our statistics are LeRobot's
``aggregate_stats`` of theirs, and our ``lerobot-train`` trains on it under FSDP2 x2 with the weighted
proportions and a bitwise resume.

1. write     (LeRobot env) writes three small datasets with LeRobot's own writer
             (``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize``), H.264 video:
             ``a`` at 10 fps and ``c`` at 20 fps name their 12x16 camera ``observation.images.top``,
             ``b`` (10 fps) names it ``observation.images.front``; state 4 floats, action 3 floats,
             3-4 episodes of 6-16 frames each. (LeRobot's default codec, AV1 via libsvtav1, dies with
             SIGFPE on a 12x16 frame in this env, so H.264, which LeRobot's writer also offers.)
2. aggregate (LeRobot env) reads each dataset's ``meta/stats.json`` with LeRobot's ``load_stats``,
             applies the rename ``observation.images.front -> observation.images.top`` to ``b``, runs
             ``lerobot.datasets.compute_stats.aggregate_stats`` on the three and saves ``lerobot.npz``;
             it also decodes frames 0, 5 and 13 of each camera with its own ``LeRobotDataset`` (pyav).
3. stats     (our env) builds ``run_meta`` (a ``MixtureMeta``) on the same LeRobot-written roots with the
             same rename and compares every feature and statistic (quantiles included) with LeRobot's:
             the same keys, shapes and values (``max |a - b|`` printed; above 1e-12 relative fails: both
             are count-weighted float64 sums).
   frames    (our env) reads the same frames through our ``MixtureDataset``: each is
             ``observation.images.top`` (``b``'s renamed), has its ``dataset_index`` and equals LeRobot's
             decode exactly.
4. train     our ``lerobot-train`` under ``torch.distributed.run --nproc-per-node=2`` with
             ``--parallelism.dp_shard=-1`` (FSDP2 over 2 CPU ranks), MLP policy, batch 8 per rank,
             ``--dataset.weights='[0.6,0.3,0.1]'``: a 12-step run, a 6-step run and its resume to 12.
             Checked: the banner says "Dataset: a mixture of 3 (weighted)"; the resumed run's losses for
             steps 7-12 equal the uninterrupted run's bitwise (and it says it resumed at step 6 and
             logs each of steps 1-12 once, so a silent restart cannot pass); the last record's
             ``samples/<repo_id>`` sum to 16 x 12 and each is within 3 sigma of its weight
             (sigma = sqrt(n w (1 - w))).

    uv run python tools/interop/mixture_lerobot_interop.py \
        --lerobot-python ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python

One line per check, PASS or FAIL; exit status 0 means every check passed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RENAME = {"observation.images.front": "observation.images.top"}
DATASETS = (  # (name, fps, camera, episode lengths)
    ("a", 10, "observation.images.top", (12, 7, 9)),
    ("b", 10, "observation.images.front", (8, 11, 14)),
    ("c", 20, "observation.images.top", (16, 8, 6, 10)),
)
WEIGHTS = (0.6, 0.3, 0.1)
STEPS, HALF, BATCH, NPROC = 12, 6, 8, 2
VCODEC = "h264"
FRAMES = (0, 5, 13)  # per dataset: frames decoded by both readers (first, mid-episode, second episode)


def repo_ids() -> list[str]:
    return [f"org/{name}" for name, *_ in DATASETS]


def renames() -> list[dict]:
    return [RENAME if camera in RENAME else {} for _, _, camera, _ in DATASETS]


# ---------------------------------------------------------------- LeRobot's side (its own environment)


def lerobot_write(tmp: Path) -> list[Path]:
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    roots = []
    for i, (name, fps, camera, lengths) in enumerate(DATASETS):
        rng = np.random.default_rng(i)
        features = {
            "observation.state": {"dtype": "float32", "shape": (4,), "names": None},
            "action": {"dtype": "float32", "shape": (3,), "names": None},
            camera: {"dtype": "video", "shape": (12, 16, 3), "names": ["height", "width", "channels"]},
        }
        root = tmp / name
        ds = LeRobotDataset.create(
            repo_id=f"org/{name}",
            fps=fps,
            features=features,
            root=root,
            rgb_encoder=RGBEncoderConfig(vcodec=VCODEC),
        )
        for n in lengths:
            for _ in range(n):
                ds.add_frame(
                    {
                        "observation.state": rng.normal(i, 1 + i, size=4).astype(np.float32),
                        "action": rng.uniform(-1 - i, 1, size=3).astype(np.float32),
                        camera: rng.integers(0, 256, (12, 16, 3), dtype=np.uint8),
                        "task": f"task {name}",
                    }
                )
            ds.save_episode()
        ds.finalize()
        roots.append(root)
    return roots


def lerobot_frames(tmp: Path, roots: list[Path]) -> None:
    """Frames ``FRAMES`` of each dataset's camera as LeRobot's own reader decodes them (float CHW)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    out = {}
    for (name, _, camera, _), root in zip(DATASETS, roots, strict=True):
        ds = LeRobotDataset(f"org/{name}", root=root, video_backend="pyav")
        for i in FRAMES:
            out[f"{name}|{i}"] = ds[i][camera].numpy()
    np.savez(tmp / "lerobot_frames.npz", **out)


def lerobot_aggregate(tmp: Path, roots: list[Path]) -> None:
    from lerobot.datasets.compute_stats import aggregate_stats
    from lerobot.datasets.io_utils import load_stats

    per = []
    for root, rename in zip(roots, renames(), strict=True):
        stats = load_stats(root)
        per.append({rename.get(k, k): v for k, v in stats.items()})
    agg = aggregate_stats(per)
    np.savez(tmp / "lerobot.npz", **{f"{k}|{s}": np.asarray(v) for k, d in agg.items() for s, v in d.items()})


# ---------------------------------------------------------------- our side


def ours(tmp: Path, roots: list[Path]) -> None:
    from lerobot_cli.datasets.config import DatasetConfig
    from lerobot_cli.datasets.mixing import MixtureMeta, run_meta

    cfg = DatasetConfig(
        repo_id=json.dumps(repo_ids()), root=json.dumps([str(r) for r in roots]), rename_map=renames()
    )
    meta = run_meta(cfg, lambda c: Path(c.root))
    assert isinstance(meta, MixtureMeta), type(meta)
    np.savez(
        tmp / "ours.npz",
        **{f"{k}|{s}": np.asarray(v) for k, per in meta.stats.items() for s, v in per.items()},
    )


def compare(tmp: Path) -> tuple[bool, str]:
    with np.load(tmp / "ours.npz") as a, np.load(tmp / "lerobot.npz") as b:
        keys_a, keys_b = set(a.files), set(b.files)
        ok, why = True, []
        if keys_a != keys_b:
            why.append(f"only ours {sorted(keys_a - keys_b)}, only LeRobot {sorted(keys_b - keys_a)}")
            ok = False
        worst = 0.0
        for key in sorted(keys_a & keys_b):
            x, y = a[key].astype(np.float64), b[key].astype(np.float64)
            if x.shape != y.shape:
                why.append(f"{key}: shape {x.shape} (ours) vs {y.shape} (LeRobot)")
                ok = False
                continue
            diff = float(np.max(np.abs(x - y))) if x.size else 0.0
            scale = float(np.max(np.abs(y))) if y.size else 0.0
            worst = max(worst, diff)
            if diff > 1e-12 * max(1.0, scale):
                why.append(f"{key}: max |ours - LeRobot| = {diff:g}")
                ok = False
        msg = (
            f"{len(keys_a & keys_b)} feature statistics of 3 LeRobot-written datasets (a renamed camera, "
            f"10 and 20 fps), max |ours - LeRobot's aggregate_stats| = {worst:g}"
        )
    return ok, msg + ("" if ok else "; " + "; ".join(why))


def compare_frames(tmp: Path, roots: list[Path]) -> tuple[bool, str]:
    """The same frames read through our mixture (renamed camera, ``dataset_index``) vs LeRobot's reader."""
    from lerobot_cli.datasets.config import DatasetConfig
    from lerobot_cli.datasets.dataset import LeRobotDataset
    from lerobot_cli.datasets.mixture import MixtureDataset

    sources = DatasetConfig(
        repo_id=json.dumps(repo_ids()), root=json.dumps([str(r) for r in roots]), rename_map=renames()
    ).sources()
    mixture = MixtureDataset([LeRobotDataset(r) for r in roots], sources)
    ok, worst, why, start = True, 0.0, [], 0
    with np.load(tmp / "lerobot_frames.npz") as theirs:
        for d, (name, _, _, lengths) in enumerate(DATASETS):
            for i in FRAMES:
                item = mixture[start + i]
                frame = item.get("observation.images.top")
                want = theirs[f"{name}|{i}"]
                if frame is None or int(item["dataset_index"]) != d:
                    why.append(f"{name}[{i}]: keys {sorted(item)}, dataset_index {item.get('dataset_index')}")
                    ok = False
                    continue
                got = frame.float().numpy()
                diff = float(np.max(np.abs(got - want))) if got.shape == want.shape else math.inf
                worst = max(worst, diff)
                if diff > 0:
                    why.append(f"{name}[{i}]: shape {got.shape} vs {want.shape}, max |diff| {diff:g}")
                    ok = False
            start += sum(lengths)
    msg = (
        f"{len(DATASETS) * len(FRAMES)} H.264 frames read through our mixture as observation.images.top "
        f"(b's renamed) with the right dataset_index, max |ours - LeRobot's decode| = {worst:g}"
    )
    return ok, msg + ("" if ok else "; " + "; ".join(why))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(*args: str) -> subprocess.CompletedProcess:
    """Our ``lerobot-train`` (this environment's) under ``torch.distributed.run`` on ``NPROC`` CPU ranks."""
    entry = Path(sys.executable).parent / "lerobot-train"
    if not entry.is_file():
        entry = Path(shutil.which("lerobot-train") or entry)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={NPROC}",
        f"--master-port={free_port()}",
        str(entry),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)


def records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def losses(recs: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def check_training(tmp: Path, roots: list[Path], report) -> None:
    whole, part = tmp / "whole", tmp / "part"
    full = train(*_train_args(whole, roots, STEPS))
    ok = full.returncode == 0
    report(ok, "train 12 steps", f"rc {full.returncode}" + ("" if ok else "\n" + _tail(full)))
    if not ok:
        return
    banner = "Dataset: a mixture of 3 (weighted)"
    line = next((x for x in full.stdout.splitlines() if banner in x), None)
    report(line is not None, "banner", line.strip() if line else f"no {banner!r} in stdout\n{_tail(full)}")

    first = train(*_train_args(part, roots, HALF))
    config = part / "checkpoints" / f"{HALF:06d}" / "pretrained_model" / "train_config.json"
    resumed = (
        train("--resume=true", f"--config_path={config}", f"--steps={STEPS}")
        if first.returncode == 0
        else first
    )
    ok = resumed.returncode == 0
    report(
        ok,
        "train 6 steps + resume to 12",
        f"rc {first.returncode}, {resumed.returncode}" + ("" if ok else "\n" + _tail(resumed)),
    )
    if not ok:
        return
    a, b = losses(records(whole)), losses(records(part))
    tail_steps = list(range(HALF + 1, STEPS + 1))
    logged = [r["step"] for r in records(part)]
    # a resume that silently started over would log the same losses: it must say where it resumed and
    # leave each step logged once
    continued = f"resuming at step {HALF}" in resumed.stdout and logged == list(range(1, STEPS + 1))
    same = continued and all(s in a and s in b and a[s] == b[s] for s in tail_steps)
    report(
        same,
        "resume bitwise",
        f"resumed at step {HALF} ({'said so' if continued else f'NOT said; steps logged {logged}'}); "
        f"steps {HALF + 1}-{STEPS} losses {[b.get(s) for s in tail_steps]}"
        + (
            " equal the uninterrupted run's"
            if same
            else f" vs uninterrupted {[a.get(s) for s in tail_steps]}"
        ),
    )

    last = records(whole)[-1]
    counts = [last.get(f"samples/{rid}") for rid in repo_ids()]
    n = NPROC * BATCH * last.get("step", -1)
    if any(c is None for c in counts):
        report(False, "proportions", f"no samples/<repo_id> in the last record: {sorted(last)}")
        return
    total_ok = sum(counts) == n == NPROC * BATCH * STEPS
    parts, within = [], True
    for rid, c, w in zip(repo_ids(), counts, WEIGHTS, strict=True):
        sigma = math.sqrt(n * w * (1 - w))
        z = (c - n * w) / sigma
        within &= abs(z) <= 3
        parts.append(f"{rid} {c}/{n} (w {w}, expected {n * w:.1f}, {z:+.2f} sigma)")
    report(
        total_ok and within,
        "proportions",
        f"step {last.get('step')}: " + ", ".join(parts) + f"; sum {sum(counts)} (16 x step = {n})",
    )


def _train_args(out: Path, roots: list[Path], steps: int) -> tuple[str, ...]:
    return (
        f"--dataset.repo_id={json.dumps(repo_ids())}",
        f"--dataset.root={json.dumps([str(r) for r in roots])}",
        f"--dataset.rename_map={json.dumps(renames())}",
        f"--dataset.weights={json.dumps(list(WEIGHTS))}",
        "--parallelism.dp_shard=-1",
        "--policy.type=mlp",
        "--policy.hidden_dim=32",
        f"--batch_size={BATCH}",
        "--num_workers=0",
        "--log_freq=1",
        f"--save_freq={HALF}",
        f"--steps={steps}",
        f"--output_dir={out}",
    )


def _tail(proc: subprocess.CompletedProcess) -> str:
    return f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lerobot-python", type=Path)
    parser.add_argument("--role", choices=("lerobot",))
    parser.add_argument("--tmp", type=Path)
    args = parser.parse_args(argv)
    if args.role == "lerobot":
        roots = lerobot_write(args.tmp)
        lerobot_aggregate(args.tmp, roots)
        lerobot_frames(args.tmp, roots)
        print(json.dumps([str(r) for r in roots]))
        return 0
    if args.lerobot_python is None:
        parser.error("--lerobot-python is required")
    failures = []

    def report(ok: bool, name: str, detail: str) -> None:
        print(f"[{name}] {'PASS' if ok else 'FAIL'}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    begin = time.perf_counter()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        cmd = [str(args.lerobot_python), __file__, "--role", "lerobot", "--tmp", str(tmp)]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
        ok = proc.returncode == 0
        frames = [sum(lengths) for *_, lengths in DATASETS]
        report(
            ok,
            "LeRobot writes + aggregates",
            f"3 datasets with LeRobot's writer ({VCODEC}, frames {frames}, fps "
            f"{[fps for _, fps, *_ in DATASETS]}), "
            + (
                "aggregate_stats and decoded frames saved"
                if ok
                else f"failed (rc {proc.returncode})\n{proc.stderr[-3000:]}"
            ),
        )
        if ok:
            roots = [Path(r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]
            ours(tmp, roots)
            same, detail = compare(tmp)
            report(same, "stats", detail)
            same, detail = compare_frames(tmp, roots)
            report(same, "frames", detail)
            check_training(tmp, roots, report)
    print(
        f"{'PASS' if not failures else 'FAIL: ' + ', '.join(failures)} ({time.perf_counter() - begin:.0f} s)"
    )
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
