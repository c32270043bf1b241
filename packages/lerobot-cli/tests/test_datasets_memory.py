"""Where the dataset keeps its frames: shared memory, so that DataLoader workers neither copy nor count
them; spawned workers get the same items; and an image path a parquet row names stays in the dataset."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lerobot_cli.datasets import DatasetError, LeRobotDataset
from lerobot_cli.datasets.writer import EpisodeData, write_dataset

IMAGE, VIDEO = "observation.images.wrist", "observation.images.top"
SMALL = {
    "observation.state": {"dtype": "float32", "shape": [3], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": None},
    VIDEO: {"dtype": "video", "shape": [16, 24, 3], "names": ["height", "width", "channels"]},
    IMAGE: {"dtype": "image", "shape": [8, 12, 3], "names": ["height", "width", "channels"]},
}


def _small_episode(ep: int, length: int) -> EpisodeData:
    rng = np.random.default_rng(ep)
    return EpisodeData(
        task=f"task {ep % 2}",
        frames={
            "observation.state": rng.normal(size=(length, 3)).astype(np.float32),
            "action": rng.normal(size=(length, 2)).astype(np.float32),
            VIDEO: np.stack([np.full((16, 24, 3), 30 * t % 250, np.uint8) for t in range(length)]),
            IMAGE: rng.integers(0, 256, (length, 8, 12, 3), dtype=np.uint8),
        },
    )


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mem") / "ds"
    return write_dataset(root, 10, SMALL, (_small_episode(e, n) for e, n in enumerate([6, 4, 5])))


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == b[key].dtype and torch.equal(value, b[key]), key
        else:
            assert value == b[key], key


def test_spawned_workers_give_the_items_the_process_does(small: Path) -> None:
    """A spawned worker receives the dataset pickled: its shared tensors arrive as the same memory."""
    dataset = LeRobotDataset(small, delta_timestamps={"action": [0.0, 0.1, 0.2]}, return_uint8=True)
    rows = [0, 5, 6, 9, 14]
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, sampler=rows, num_workers=1, multiprocessing_context="spawn"
    )
    got = list(loader)
    assert len(got) == len(rows)
    for row, item in zip(rows, got, strict=True):
        _same(item, dataset[row])


def test_an_image_path_in_a_parquet_row_must_stay_inside_the_dataset(small: Path, tmp_path: Path) -> None:
    """A row whose image has no bytes falls back to its ``path``: inside the root it is read, a path
    that leaves the root is refused, naming the data file."""
    import shutil

    root = Path(shutil.copytree(small, tmp_path / "ds"))
    data = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    images = table[IMAGE].combine_chunks()
    expected = LeRobotDataset(root)[0][IMAGE]
    first = images[0].as_py()["bytes"]
    (root / "images").mkdir(exist_ok=True)
    (root / "images/first.png").write_bytes(first)
    outside = tmp_path / "outside.png"
    outside.write_bytes(first)

    def with_row0(path: str) -> None:
        rows = images.to_pylist()
        rows[0] = {"bytes": None, "path": path}
        column = pa.array(rows, type=images.type)
        pq.write_table(table.set_column(table.schema.get_field_index(IMAGE), IMAGE, column), data)

    with_row0("images/first.png")
    assert torch.equal(LeRobotDataset(root)[0][IMAGE], expected)
    for bad in ("../outside.png", str(outside)):
        with_row0(bad)
        with pytest.raises(DatasetError) as err:
            LeRobotDataset(root)[0]
        message = str(err.value)
        assert str(data) in message and "an image path" in message and bad in message


_MEMORY_CHILD = textwrap.dedent(
    """
    import json, sys
    def anon_kib():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    import torch
    from lerobot_cli.datasets import LeRobotDataset
    from lerobot_cli.datasets.metadata import load_meta
    load_meta(sys.argv[1])  # warm the readers' imports and caches
    before = anon_kib()
    dataset = LeRobotDataset(sys.argv[1])
    after = anon_kib()
    table_kib = sum(t.numel() * t.element_size() for t in dataset._columns.values()) // 1024
    print(json.dumps({"grew_kib": after - before, "columns_kib": table_kib, "frames": len(dataset)}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads RssAnon from /proc (Linux)")
def test_a_long_dataset_adds_no_private_memory_that_workers_would_inherit(tmp_path: Path) -> None:
    """200,000 frames of 64+64 floats (about 100 MiB of columns, several times that of parquet decoding
    on the way): the process that built the dataset grows its private memory by far less than that (what
    the allocators keep after the reads, about 20 MiB here), since the frames live in shared memory and
    the readers' freed memory is handed back. A forked DataLoader worker starts
    with every private page of its parent mapped, so this is what each worker would otherwise carry."""
    features = {
        "observation.state": {"dtype": "float32", "shape": [64], "names": None},
        "action": {"dtype": "float32", "shape": [64], "names": None},
    }
    rng = np.random.default_rng(0)

    def episodes():
        for ep in range(50):
            yield EpisodeData(
                task="t",
                frames={k: rng.normal(size=(4000, 64)).astype(np.float32) for k in features},
            )

    root = write_dataset(tmp_path / "long", 30, features, episodes())
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(root)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["frames"] == 200_000 and out["columns_kib"] > 100_000
    assert out["grew_kib"] < out["columns_kib"] / 3, out


class _Threads(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        from lerobot_cli.datasets.dataset import camera_threads

        return camera_threads(3)


def test_camera_threads_share_the_cores_among_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cameras decode in parallel on the cores the workers leave: 8 cores, 1 process: all 3 cameras at
    once; 4 workers: 2 each; 8 workers: 1 each."""
    from lerobot_cli.datasets import dataset as module

    monkeypatch.setattr(module, "_threads", {})
    monkeypatch.setattr(module.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert module.camera_threads(3) == 3 and module.camera_threads(12) == 8
    for workers, each in ((4, 2), (8, 1)):
        loader = torch.utils.data.DataLoader(_Threads(), batch_size=None, num_workers=workers)
        assert set(loader) == {each}
