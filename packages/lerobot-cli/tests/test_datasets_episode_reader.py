"""``EpisodeReader``: per-episode reads that give LeRobotDataset's items bit for bit, on the edge-case
layout of test_datasets_edge.py; a data file whose rows do not match meta/episodes is refused; building
one on a long dataset costs no memory for its frames; the last episodes read are cached."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lerobot_cli.datasets import DatasetError, LeRobotDataset, load_meta
from lerobot_cli.datasets import episode_reader as module
from lerobot_cli.datasets.episode_reader import EpisodeReader
from lerobot_cli.datasets.writer import EpisodeData, FileLimits, write_dataset

FPS = 10
LENGTHS = [5, 1, 7, 3, 9, 4, 6]
TASKS = ["pick the cube", "place the cube"]
VIDEO, IMAGE = "observation.images.top", "observation.images.wrist"
DELTA = {
    "observation.state": [-0.2, -0.1, 0.0, 0.1],
    "action": [0.0, 0.1, 0.2],
    VIDEO: [-0.1, 0.0, 0.1],
    IMAGE: [-0.1, 0.0],
}
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [3], "names": ["a", "b", "c"]},
    "observation.joint": {"dtype": "float64", "shape": [2], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
    "next.done": {"dtype": "bool", "shape": [1], "names": None},
    "observation.step": {"dtype": "int64", "shape": [1], "names": None},
    VIDEO: {"dtype": "video", "shape": [32, 48, 3], "names": ["height", "width", "channels"]},
    IMAGE: {"dtype": "image", "shape": [24, 32, 3], "names": ["height", "width", "channels"]},
}


def _episode(ep: int, length: int) -> EpisodeData:
    t = np.arange(length)
    video = np.empty((length, 32, 48, 3), np.uint8)
    for i in t:
        video[i] = ((40 + 37 * i) % 200, (60 + 23 * ep) % 200, 120)
        video[i, 4:12, 2 + 4 * i : 10 + 4 * i] = 250
    rng = np.random.default_rng(ep)
    return EpisodeData(
        task=TASKS[ep % 2],
        frames={
            "observation.state": np.stack([ep * 100 + t, -t, t * 0.5], axis=1).astype(np.float32),
            "observation.joint": np.stack([t * 1e-9, t + 0.25], axis=1).astype(np.float64),
            "action": np.stack([ep * 100 + t + 1000, t], axis=1).astype(np.float32),
            "next.done": t == length - 1,
            "observation.step": (t * 3).astype(np.int64)[:, None],
            VIDEO: video,
            IMAGE: rng.integers(0, 256, (length, 24, 32, 3), dtype=np.uint8),
        },
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(
        tmp_path_factory.mktemp("epreader") / "ds",
        FPS,
        FEATURES,
        (_episode(e, n) for e, n in enumerate(LENGTHS)),
        limits=FileLimits(chunks_size=2, data_files_size_in_mb=0.06, video_files_size_in_mb=0.004),
    )


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == b[key].dtype and value.shape == b[key].shape, key
            assert torch.equal(value, b[key]), key
        else:
            assert value == b[key], key


@pytest.mark.parametrize(
    ("episodes", "delta", "uint8"),
    [(None, None, False), (None, DELTA, False), (None, DELTA, True), ([4, 1, 6], DELTA, False)],
    ids=["plain", "windows", "windows-uint8", "selection"],
)
def test_every_frame_is_the_datasets_item(root: Path, episodes, delta, uint8: bool) -> None:
    dataset = LeRobotDataset(root, episodes=episodes, delta_timestamps=delta, return_uint8=uint8)
    reader = EpisodeReader(root, episodes=episodes, delta_timestamps=delta, return_uint8=uint8)
    assert reader.fps == dataset.fps and reader.features == dataset.features
    assert reader.stats is dataset.meta.stats or reader.stats.keys() == dataset.stats.keys()
    selected = LENGTHS if episodes is None else [LENGTHS[e] for e in sorted(episodes)]
    assert reader.lengths == selected and sum(reader.lengths) == len(dataset)
    for e, length in enumerate(reader.lengths):
        start = int(dataset._ep_start[e])
        items = reader.read(e, list(range(length)))
        assert len(items) == length
        for f, item in enumerate(items):
            _same(item, dataset[start + f])
    # any order, repeats, and a single frame at a time
    e = len(reader.lengths) - 1
    frames = [reader.lengths[e] - 1, 0, 0, 2]
    start = int(dataset._ep_start[e])
    for f, item in zip(frames, reader.read(e, frames), strict=True):
        _same(item, dataset[start + f])


def test_out_of_range_episode_or_frame(root: Path) -> None:
    reader = EpisodeReader(root)
    with pytest.raises(IndexError):
        reader.read(len(LENGTHS), [0])
    with pytest.raises(IndexError):
        reader.read(1, [1])  # the 1-frame episode


@pytest.mark.parametrize("damage", ["missing", "shifted"])
def test_rows_that_are_not_the_episodes_range_are_refused(root: Path, tmp_path: Path, damage: str) -> None:
    copy = Path(shutil.copytree(root, tmp_path / "ds"))
    meta = load_meta(copy)
    pos = 2  # episode 2 (7 frames), in a file with other episodes
    data = meta.data_file(pos)
    first = int(meta.episodes["dataset_from_index"][pos])
    table = pq.read_table(data)
    index = table["index"].to_numpy()
    if damage == "missing":
        table = table.filter(pa.array(index != first + 3))
    else:
        shifted = np.where(table["episode_index"].to_numpy() == 2, index + 1, index)
        table = table.set_column(table.schema.get_field_index("index"), "index", pa.array(shifted))
    pq.write_table(table, data)
    reader = EpisodeReader(copy)
    with pytest.raises(DatasetError) as err:
        reader.read(pos, [0])
    assert str(data) in str(err.value) and "do not match meta/episodes" in str(err.value)
    with pytest.raises(DatasetError, match="do not match meta/episodes"):
        LeRobotDataset(copy)  # the same check as the dataset's
    assert reader.read(0, [0])[0]["index"].item() == 0  # other episodes still read


def test_a_file_without_index_statistics_picks_row_groups_from_its_index_column(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = Path(shutil.copytree(root, tmp_path / "ds"))
    data = load_meta(copy).data_file(2)
    table = pq.read_table(data)
    with pq.ParquetWriter(data, table.schema, write_statistics=False) as writer:
        for ep in np.unique(table["episode_index"].to_numpy()):
            writer.write_table(table.filter(pa.compute.equal(table["episode_index"], ep)))
    assert pq.ParquetFile(data).metadata.row_group(0).column(0).statistics is None
    groups = []
    real = module.read_row_groups
    monkeypatch.setattr(module, "read_row_groups", lambda p, g, c: groups.append(g) or real(p, g, c))
    dataset, reader = LeRobotDataset(copy), EpisodeReader(copy)
    _same(reader.read(2, [6])[0], dataset[int(dataset._ep_start[2]) + 6])
    assert len(groups) == 1 and len(groups[0]) == 1  # only the episode's row group


def test_recent_episodes_are_read_once_while_cached(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[tuple[str, tuple[int, ...]]] = []
    real = module.read_row_groups

    def counting(path, groups, columns):
        reads.append((str(path), tuple(groups)))
        return real(path, groups, columns)

    monkeypatch.setattr(module, "read_row_groups", counting)
    reader = EpisodeReader(root, cache_episodes=3)
    for _ in range(3):
        for e in (0, 2, 4):  # three episodes, alternately
            reader.read(e, [0])
    assert len(reads) == 3 and len(set(reads)) == 3
    assert reader.cached_episodes == [0, 2, 4]
    # each read takes only the row groups of its episode (the writer makes one per episode)
    for (path, groups), e in zip(reads, (0, 2, 4), strict=True):
        starts = np.cumsum([0] + [g.num_rows for g in _row_groups(path)])
        ep_index = pq.read_table(path, columns=["episode_index"])["episode_index"].to_numpy()
        assert [set(ep_index[starts[g] : starts[g + 1]].tolist()) for g in groups] == [{e}]
    reader.read(0, [1])  # a hit makes 0 the most recently read
    assert reader.cached_episodes == [2, 4, 0] and len(reads) == 3
    reader.read(5, [0])  # a fourth: the least recently read one goes
    assert reader.cached_episodes == [4, 0, 5] and len(reads) == 4
    reader.read(2, [0])
    assert len(reads) == 5 and reader.cached_episodes == [0, 5, 2]
    uncached = EpisodeReader(root, cache_episodes=0)
    uncached.read(0, [0])
    uncached.read(0, [0])
    assert uncached.cached_episodes == [] and len(reads) == 7


def _row_groups(path: str) -> list:
    metadata = pq.ParquetFile(path).metadata
    return [metadata.row_group(g) for g in range(metadata.num_row_groups)]


_MEMORY_CHILD = textwrap.dedent(
    """
    import json, sys
    def anon_kib():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    import torch
    from lerobot_cli.datasets.episode_reader import EpisodeReader
    from lerobot_cli.datasets.metadata import load_meta
    load_meta(sys.argv[1])  # warm the readers' imports and caches
    before = anon_kib()
    reader = EpisodeReader(sys.argv[1])
    after = anon_kib()
    items = reader.read(len(reader.lengths) - 1, [0, 1])
    print(json.dumps({"grew_kib": after - before, "frames": sum(reader.lengths),
                      "state": items[1]["observation.state"].tolist()}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads RssAnon from /proc (Linux)")
def test_a_long_dataset_costs_no_memory_for_its_frames(tmp_path: Path) -> None:
    """200,000 frames of 64+64 float32 (about 100 MiB of columns): building a reader reads meta/ only,
    so its private memory grows by a small fraction of that."""
    features = {
        "observation.state": {"dtype": "float32", "shape": [64], "names": None},
        "action": {"dtype": "float32", "shape": [64], "names": None},
    }
    rng = np.random.default_rng(0)
    last = {}

    def episodes():
        for ep in range(50):
            frames = {k: rng.normal(size=(4000, 64)).astype(np.float32) for k in features}
            last["state"] = frames["observation.state"][1]
            yield EpisodeData(task="t", frames=frames)

    root = write_dataset(tmp_path / "long", 30, features, episodes())
    columns_kib = 200_000 * (64 + 64) * 4 // 1024
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(root)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["frames"] == 200_000
    assert out["grew_kib"] < columns_kib / 20, out
    assert out["state"] == last["state"].tolist()
