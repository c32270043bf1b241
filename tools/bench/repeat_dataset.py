"""Make a LeRobot v3.0 dataset ``--times`` times longer without encoding any video: its episodes repeated.

Why: a loader's memory per DataLoader worker should not grow with the number or length of episodes, and
proving it needs a dataset with many more frames than a real-resolution benchmark can afford to encode.
The copy repeats every episode ``--times`` times: its rows in one ``data/`` parquet file (renumbered
``index`` and ``episode_index``), its ``meta/episodes`` row (renumbered, pointing at the same video span),
and hard links to the source's video files (no bytes copied; the same filesystem is needed). The data
file has one row group per episode, as LeRobot 0.6.1 writes it. Every other
``meta/`` file is copied, with ``total_episodes``/``total_frames``/``splits`` updated in ``info.json``.
Both this project's ``LeRobotDataset`` and LeRobot 0.6.1's read the result::

    python tools/bench/repeat_dataset.py --src /tmp/robot_av1 --dst /tmp/robot_av1_x500 --times 500

Needs only numpy and pyarrow (either this workspace's interpreter or LeRobot's).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"


def _repeat_rows(table: pa.Table, times: int) -> tuple[pa.Table, np.ndarray]:
    """``table`` repeated ``times`` times, and which copy each row belongs to."""
    copies = np.repeat(np.arange(times, dtype=np.int64), table.num_rows)
    take = pa.array(np.tile(np.arange(table.num_rows, dtype=np.int64), times))
    return table.take(take), copies


def _replace(table: pa.Table, name: str, values: np.ndarray) -> pa.Table:
    pos = table.schema.get_field_index(name)
    return table.set_column(
        pos, table.schema.field(name), pa.array(values, type=table.schema.field(name).type)
    )


def _write_per_episode(data: pa.Table, path: Path) -> None:
    """One row group per episode, as LeRobot 0.6.1 writes data files (a streaming reader then reads an
    episode's rows and no other)."""
    data = data.sort_by("index")
    episode = data["episode_index"].to_numpy()
    cuts = [0, *(np.flatnonzero(np.diff(episode)) + 1).tolist(), data.num_rows]
    with pq.ParquetWriter(path, data.schema) as writer:
        for a, b in itertools.pairwise(cuts):
            writer.write_table(data.slice(a, b - a))


def repeat(src: Path, dst: Path, times: int) -> dict:
    info = json.loads((src / "meta/info.json").read_text())
    episodes = pq.read_table(src / "meta/episodes")
    data = pq.read_table(src / "data")
    n_eps, n_frames = episodes.num_rows, data.num_rows
    if sorted(data["index"].to_numpy().tolist()) != list(range(n_frames)):
        raise SystemExit(f"{src}: rows' index is not 0..{n_frames - 1}")

    data, copies = _repeat_rows(data, times)
    data = _replace(data, "index", data["index"].to_numpy() + copies * n_frames)
    data = _replace(data, "episode_index", data["episode_index"].to_numpy() + copies * n_eps)
    episodes, copies = _repeat_rows(episodes, times)
    for name, shift in (
        ("episode_index", n_eps),
        ("dataset_from_index", n_frames),
        ("dataset_to_index", n_frames),
    ):
        episodes = _replace(episodes, name, episodes[name].to_numpy() + copies * shift)
    for name in ("data/chunk_index", "data/file_index"):
        episodes = _replace(episodes, name, np.zeros(episodes.num_rows, dtype=np.int64))

    if dst.exists():
        raise SystemExit(f"{dst} exists; remove it or pick another --dst")
    (dst / DATA).parent.mkdir(parents=True)
    (dst / EPISODES).parent.mkdir(parents=True)
    _write_per_episode(data, dst / DATA)
    pq.write_table(episodes, dst / EPISODES)
    for path in (src / "meta").iterdir():
        if path.is_file() and path.name != "info.json":
            shutil.copyfile(path, dst / "meta" / path.name)
    for path in (src / "videos").rglob("*.mp4") if (src / "videos").is_dir() else ():
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, target)
    info["total_episodes"] = n_eps * times
    info["total_frames"] = n_frames * times
    info["splits"] = {"train": f"0:{n_eps * times}"}
    (dst / "meta/info.json").write_text(json.dumps(info, indent=4))
    return {"episodes": n_eps * times, "frames": n_frames * times}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--dst", type=Path, required=True)
    parser.add_argument("--times", type=int, required=True)
    args = parser.parse_args(argv)
    if args.times < 1:
        parser.error("--times must be at least 1")
    out = repeat(args.src, args.dst, args.times)
    print(f"{args.dst}: {out['episodes']} episodes, {out['frames']} frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
