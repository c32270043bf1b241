"""``StreamedDataset``: what ``--dataset.streaming=true`` reads, item for item the map-style dataset's, and
the flags that cannot go with streaming refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_cli.datasets import LeRobotDataset
from lerobot_cli.datasets.config import DatasetConfig
from lerobot_cli.datasets.episode_reader import EpisodeReader
from lerobot_cli.datasets.mixing import MixtureMeta
from lerobot_cli.datasets.mixture import MixtureDataset
from lerobot_cli.datasets.streamed import StreamedDataset
from lerobot_cli.datasets.writer import EpisodeData, write_dataset

SHAPE = [6, 8, 3]


def _write(root, camera: str, lengths: list[int], base: int, fps: int = 10):
    features = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        camera: {"dtype": "video", "shape": SHAPE, "names": ["height", "width", "channels"]},
    }

    def episode(ep: int, n: int) -> EpisodeData:
        rng = np.random.default_rng(base + ep)
        return EpisodeData(
            task=f"task {base + ep % 2}",
            frames={
                "observation.state": rng.normal(size=(n, 2)).astype(np.float32),
                "action": rng.normal(size=(n, 2)).astype(np.float32),
                camera: rng.integers(0, 250, (n, *SHAPE), dtype=np.uint8),
            },
        )

    return write_dataset(root, fps, features, (episode(e, n) for e, n in enumerate(lengths)))


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("streamed")
    return (
        _write(tmp / "a", "observation.images.top", [5, 3, 6], 0),
        _write(tmp / "b", "observation.images.front", [4, 2, 7], 10, fps=20),
    )


def _equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), key
        else:
            assert value == b[key], key


def test_a_streamed_mixture_reads_the_map_style_mixtures_items(roots):
    cfg = DatasetConfig(
        repo_id='["org/a","org/b"]',
        root=f'["{roots[0]}","{roots[1]}"]',
        rename_map=({}, {"observation.images.front": "observation.images.top"}),
        streaming=True,
    )
    sources = cfg.sources()
    delta = [
        {"action": [0.0, 0.1, 0.2], "observation.images.top": [-0.1, 0.0]},
        {"action": [0.0, 0.1, 0.2], "observation.images.front": [-0.1, 0.0]},
    ]
    streamed = StreamedDataset(
        [EpisodeReader(r, None, d, return_uint8=True) for r, d in zip(roots, delta, strict=True)],
        sources,
        drop_last=2,
    )
    mapped = MixtureDataset(
        [LeRobotDataset(r, delta_timestamps=d, return_uint8=True) for r, d in zip(roots, delta, strict=True)],
        sources,
    )
    assert isinstance(streamed.meta, MixtureMeta) and streamed.meta.tasks == mapped.meta.tasks
    # drop_last=2: episodes of 2 frames or fewer start no sample and are left out
    assert streamed.lengths == [3, 1, 4, 2, 5]
    assert streamed.sizes == [8, 7]
    rows = mapped.rows_without_last(2).tolist()
    assert len(rows) == streamed.num_samples == 15
    starts = [0, 5, 8, 14, 18, 20]  # each streamed episode's first row in the mixture
    streamed_rows = [starts[[0, 1, 2, 3, 5][e]] + f for e, n in enumerate(streamed.lengths) for f in range(n)]
    assert streamed_rows == rows
    for e, n in enumerate(streamed.lengths):
        items = streamed.read(e, list(range(n)))
        for f, item in enumerate(items):
            _equal(item, mapped[starts[[0, 1, 2, 3, 5][e]] + f])


def test_one_streamed_dataset_reads_its_items_unlabelled(roots):
    streamed = StreamedDataset([EpisodeReader(roots[0], [2, 0], return_uint8=True)])
    mapped = LeRobotDataset(roots[0], episodes=[2, 0], return_uint8=True)
    assert streamed.lengths == [5, 6] and not streamed.is_mixture  # in the dataset's order
    for row, item in enumerate(streamed.read(0, range(5)) + streamed.read(1, range(6))):
        _equal(item, mapped[row])


def test_dropping_every_frame_is_refused_in_one_line(roots):
    with pytest.raises(Exception, match="drop_n_last_frames=9 leaves no frame"):
        StreamedDataset([EpisodeReader(roots[0])], drop_last=9)


def test_a_mixture_takes_one_revision_per_dataset_or_one_for_all():
    two = {"repo_id": '["a/b","c/d"]'}
    assert [s.revision for s in DatasetConfig(**two, revision="v1").sources()] == ["v1", "v1"]
    listed = DatasetConfig(**two, revision='["v1",null]')
    assert [s.revision for s in listed.sources()] == ["v1", None]
    assert listed.source_config(listed.sources()[0]).revision == "v1"
    with pytest.raises(ValueError, match="for 2 datasets give a JSON list of 2 revisions"):
        DatasetConfig(**two, revision='["v1"]')
    with pytest.raises(ValueError, match="one dataset takes one revision"):
        DatasetConfig(repo_id="a/b", revision='["v1"]')


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"eval_split": 0.2}, "--dataset.eval_split=0.2 holds out episodes of a map-style dataset"),
        (
            {"repo_id": '["a/b","c/d"]', "weights": (0.5, 0.5)},
            "--dataset.weights samples a mixture map-style",
        ),
        ({"streaming_buffer_size": 0}, "--dataset.streaming_buffer_size must be a whole number >= 1"),
        ({"streaming_cache_mb": -1}, "--dataset.streaming_cache_mb must be a whole number >= 1"),
    ],
)
def test_flags_that_cannot_stream_are_refused(flags, message):
    base = {"repo_id": "a/b", "streaming": True}
    with pytest.raises(ValueError, match=message):
        DatasetConfig(**{**base, **flags})


def test_a_data_file_in_one_row_group_is_read_whole_with_one_warning(tmp_path, caplog):
    import pyarrow.parquet as pq

    features = {"observation.state": {"dtype": "float32", "shape": [2], "names": None}}
    episodes = (
        EpisodeData(task="t", frames={"observation.state": np.zeros((400, 2), np.float32)}) for _ in range(5)
    )
    root = write_dataset(tmp_path / "one_group", 10, features, episodes)
    (data,) = sorted((root / "data").rglob("*.parquet"))
    pq.write_table(pq.read_table(data), data)  # rewritten as older writers did: one row group per file
    reader = EpisodeReader(root)
    with caplog.at_level("WARNING"):
        reader.read(0, [0])
        reader.read(1, [0])
    warnings = [r.getMessage() for r in caplog.records if "row group" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "keeps 2000 frames in the row group(s) of an episode of 400" in warnings[0]
    caplog.clear()
    with caplog.at_level("WARNING"):
        StreamedDataset([EpisodeReader(_write(tmp_path / "per_episode", "cam", [300, 400, 500], 0))])
        reader = EpisodeReader(tmp_path / "per_episode")
        reader.read(2, [0])
    assert not [r for r in caplog.records if "row group" in r.getMessage()]


_STREAM_CHILD = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import torch
    from lerobot_cli.datasets.episode_reader import EpisodeReader
    from lerobot_cli.datasets.streamed import StreamedDataset
    from lerobot_trainloop.streaming import StreamingDataSource

    def children():
        me = os.getpid()
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    stat = Path(f"/proc/{name}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                    yield int(name)

    def hwm_kib(pid):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    dataset = StreamedDataset([EpisodeReader(sys.argv[1], delta_timestamps={"action": [0.0, 0.1]})])
    source = StreamingDataSource(
        dataset.read, dataset.lengths, 16, device=torch.device("cpu"), seed=0, num_workers=1, buffer_size=200
    )
    for i, batch in enumerate(source):
        if i == 60:
            workers = [hwm_kib(pid) for pid in children()]  # while the worker lives
            break
    print(json.dumps({"worker_kib": max(workers), "frames": dataset.num_samples}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc (Linux)")
def test_a_streaming_workers_memory_does_not_grow_with_the_dataset(tmp_path):
    """The same episodes 8 times over (tools/bench/repeat_dataset.py: 25,000 -> 200,000 frames of 64+64
    floats, about 100 MiB of columns): a streaming worker's peak memory stays where it was, since it
    holds the row groups of the episodes it reads, not the dataset."""
    features = {
        "observation.state": {"dtype": "float32", "shape": [64], "names": None},
        "action": {"dtype": "float32", "shape": [64], "names": None},
    }
    rng = np.random.default_rng(0)
    episodes = (
        EpisodeData(task="t", frames={k: rng.normal(size=(1000, 64)).astype(np.float32) for k in features})
        for _ in range(25)
    )
    one = write_dataset(tmp_path / "x1", 30, features, episodes)
    repeat = Path(__file__).resolve().parents[3] / "tools" / "bench" / "repeat_dataset.py"
    eight = tmp_path / "x8"
    subprocess.run(
        [sys.executable, str(repeat), "--src", str(one), "--dst", str(eight), "--times", "8"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    peaks = {}
    for root in (one, eight):
        proc = subprocess.run(
            [sys.executable, "-c", _STREAM_CHILD, str(root)],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        peaks[out["frames"]] = out["worker_kib"]
    assert sorted(peaks) == [25_000, 200_000]
    assert peaks[200_000] - peaks[25_000] < 32 * 1024, peaks  # 100 MiB of columns would show


def test_streaming_a_repo_id_reads_the_hub_even_when_lerobot_cached_it(roots, tmp_path, monkeypatch):
    """Where a streamed dataset is read depends on the flags alone, never on one machine's cache: a node
    with a cached copy and one without must read the same data (and agree on the revision's broadcast)."""
    import shutil

    from lerobot_cli.datasets.stream_location import remote_url

    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    shutil.copytree(roots[0], tmp_path / "home" / "org" / "a")
    cfg = DatasetConfig(repo_id="org/a", streaming=True)
    assert remote_url(cfg) == "hf://datasets/org/a"
    assert remote_url(DatasetConfig(repo_id="org/a", root=str(roots[0]), streaming=True)) is None
    assert remote_url(DatasetConfig(repo_id="org/a", root="s3://b/a", streaming=True)) == "s3://b/a"
