r"""Check that a mixture's normalisation statistics are LeRobot's ``aggregate_stats`` of its datasets'.

1. ours     (our env) writes three small datasets with our writer (one names its camera
            ``observation.images.front`` where the others say ``observation.images.top``; one runs at 20 fps,
            the others at 10), builds ``MixtureMeta`` with the rename and saves its ``stats`` (every
            feature, every statistic, quantiles included) to ``ours.npz``.
2. lerobot  (LeRobot env) reads each dataset's ``meta/stats.json`` with LeRobot's ``load_stats``,
            applies the same rename, runs ``lerobot.datasets.compute_stats.aggregate_stats`` on the three
            and saves the result to ``lerobot.npz``.
3. compare  every feature and statistic of both: the same keys, shapes and values (``max |a - b|`` printed;
            anything above 1e-12 relative fails: both are count-weighted float64 sums).

    uv run python tools/interop/mixture_lerobot_interop.py \
        --lerobot-python ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python

Exit status 0 means every comparison passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RENAME = {"observation.images.front": "observation.images.top"}
DATASETS = (  # (name, fps, camera, episode lengths)
    ("a", 10, "observation.images.top", (12, 7, 9)),
    ("b", 10, "observation.images.front", (5, 11)),
    ("c", 20, "observation.images.top", (16, 8, 6, 10)),
)


def ours(tmp: Path) -> list[Path]:
    from lerobot_cli.datasets import load_meta
    from lerobot_cli.datasets.config import DatasetConfig
    from lerobot_cli.datasets.mixture import MixtureMeta
    from lerobot_cli.datasets.writer import EpisodeData, write_dataset

    roots = []
    for i, (name, fps, camera, lengths) in enumerate(DATASETS):
        rng = np.random.default_rng(i)
        features = {
            "observation.state": {"dtype": "float32", "shape": [4], "names": None},
            "action": {"dtype": "float32", "shape": [3], "names": None},
            camera: {"dtype": "video", "shape": [12, 16, 3], "names": ["height", "width", "channels"]},
        }
        episodes = (
            EpisodeData(
                task=f"task {name}",
                frames={
                    "observation.state": rng.normal(i, 1 + i, size=(n, 4)).astype(np.float32),
                    "action": rng.uniform(-1 - i, 1, size=(n, 3)).astype(np.float32),
                    camera: rng.integers(0, 256, (n, 12, 16, 3), dtype=np.uint8),
                },
            )
            for n in lengths
        )
        roots.append(write_dataset(tmp / name, fps, features, episodes))
    renames = [RENAME if camera in RENAME else {} for _, _, camera, _ in DATASETS]
    cfg = DatasetConfig(
        repo_id=json.dumps([f"org/{name}" for name, *_ in DATASETS]),
        root=json.dumps([str(r) for r in roots]),
        rename_map=renames,
    )
    sources = cfg.sources()
    meta = MixtureMeta([load_meta(s.root) for s in sources], sources)
    np.savez(
        tmp / "ours.npz",
        **{f"{k}|{s}": np.asarray(v) for k, per in meta.stats.items() for s, v in per.items()},
    )
    return roots


def lerobot(tmp: Path, roots: list[str]) -> None:
    from lerobot.datasets.compute_stats import aggregate_stats
    from lerobot.datasets.io_utils import load_stats

    per = []
    for root in roots:
        stats = load_stats(Path(root))
        per.append({RENAME.get(k, k): v for k, v in stats.items()})
    agg = aggregate_stats(per)
    np.savez(tmp / "lerobot.npz", **{f"{k}|{s}": np.asarray(v) for k, d in agg.items() for s, v in d.items()})


def compare(tmp: Path) -> bool:
    with np.load(tmp / "ours.npz") as a, np.load(tmp / "lerobot.npz") as b:
        keys_a, keys_b = set(a.files), set(b.files)
        ok = True
        if keys_a != keys_b:
            only_a, only_b = sorted(keys_a - keys_b), sorted(keys_b - keys_a)
            print(f"  MISMATCH keys: only ours {only_a}, only LeRobot {only_b}")
            ok = False
        worst = 0.0
        for key in sorted(keys_a & keys_b):
            x, y = a[key].astype(np.float64), b[key].astype(np.float64)
            if x.shape != y.shape:
                print(f"  MISMATCH {key}: shape {x.shape} (ours) vs {y.shape} (LeRobot)")
                ok = False
                continue
            diff = float(np.max(np.abs(x - y))) if x.size else 0.0
            scale = float(np.max(np.abs(y))) if y.size else 0.0
            worst = max(worst, diff)
            if diff > 1e-12 * max(1.0, scale):
                print(f"  MISMATCH {key}: max |ours - LeRobot| = {diff:g}")
                ok = False
        print(
            f"[stats] mixture of {len(DATASETS)} datasets (a renamed camera, 10 and 20 fps): "
            f"{len(keys_a & keys_b)} feature statistics, max |ours - LeRobot's aggregate_stats| = {worst:g}"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lerobot-python", type=Path)
    parser.add_argument("--role", choices=("lerobot",))
    parser.add_argument("--tmp", type=Path)
    parser.add_argument("roots", nargs="*")
    args = parser.parse_args(argv)
    if args.role == "lerobot":
        lerobot(args.tmp, args.roots)
        return 0
    if args.lerobot_python is None:
        parser.error("--lerobot-python is required")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        roots = ours(tmp)
        cmd = [str(args.lerobot_python), __file__, "--role", "lerobot", "--tmp", str(tmp), *map(str, roots)]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            print(proc.stderr[-3000:])
            print("FAIL: LeRobot's side failed")
            return 1
        ok = compare(tmp)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
