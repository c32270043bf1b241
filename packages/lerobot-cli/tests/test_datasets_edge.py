"""The reader on an edge-case dataset written here: tiny files (several episodes per data and video file,
several chunk directories), a 1-frame episode, two tasks, an ``image`` feature stored as PNG bytes in
parquet, a ``video`` camera, bool / float64 / int64 features, and delta_timestamps windows that cross
episode boundaries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from lerobot_cli.datasets import DatasetError, LeRobotDataset, load_meta
from lerobot_cli.datasets.dataset import cameras_to_float
from lerobot_cli.datasets.writer import EpisodeData, FileLimits, write_dataset

FPS = 10
LENGTHS = [5, 1, 7, 3, 9, 4, 6]
TASKS = ["pick the cube", "place the cube"]
VIDEO, IMAGE = "observation.images.top", "observation.images.wrist"


def _video_frame(ep: int, t: int) -> np.ndarray:
    """Flat colour that changes a lot per frame plus a moving block: easy to tell frames apart."""
    frame = np.empty((32, 48, 3), np.uint8)
    frame[...] = ((40 + 37 * t) % 200, (60 + 23 * ep) % 200, 120)
    frame[4:12, 2 + 4 * t : 10 + 4 * t] = 250
    return frame


def _image_frame(ep: int, t: int) -> np.ndarray:
    return np.random.default_rng(1000 * ep + t).integers(0, 256, (24, 32, 3), dtype=np.uint8)


def _episode(ep: int, length: int) -> EpisodeData:
    t = np.arange(length)
    return EpisodeData(
        task=TASKS[ep % 2],
        frames={
            "observation.state": np.stack([ep * 100 + t, -t, t * 0.5], axis=1).astype(np.float32),
            "observation.joint": np.stack([t * 1e-9, t + 0.25], axis=1).astype(np.float64),
            "action": np.stack([ep * 100 + t + 1000, t], axis=1).astype(np.float32),
            "next.done": t == length - 1,
            "observation.step": (t * 3).astype(np.int64)[:, None],
            VIDEO: np.stack([_video_frame(ep, i) for i in t]),
            IMAGE: np.stack([_image_frame(ep, i) for i in t]),
        },
    )


FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [3], "names": ["a", "b", "c"]},
    "observation.joint": {"dtype": "float64", "shape": [2], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
    "next.done": {"dtype": "bool", "shape": [1], "names": None},
    "observation.step": {"dtype": "int64", "shape": [1], "names": None},
    VIDEO: {"dtype": "video", "shape": [32, 48, 3], "names": ["height", "width", "channels"]},
    IMAGE: {"dtype": "image", "shape": [24, 32, 3], "names": ["height", "width", "channels"]},
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(
        tmp_path_factory.mktemp("edge") / "ds",
        FPS,
        FEATURES,
        (_episode(e, n) for e, n in enumerate(LENGTHS)),
        limits=FileLimits(chunks_size=2, data_files_size_in_mb=0.06, video_files_size_in_mb=0.004),
    )


@pytest.fixture(scope="module")
def dataset(root: Path) -> LeRobotDataset:
    return LeRobotDataset(
        root, delta_timestamps={"observation.state": [-0.2, -0.1, 0.0, 0.1], "action": [0.0, 0.1, 0.2]}
    )


def _starts() -> list[int]:
    return np.concatenate([[0], np.cumsum(LENGTHS)[:-1]]).tolist()


def test_layout_has_several_episodes_per_file_and_several_chunks(root: Path) -> None:
    eps = load_meta(root).episodes
    data_files = list(zip(eps["data/chunk_index"], eps["data/file_index"]))
    video_files = list(zip(eps[f"videos/{VIDEO}/chunk_index"], eps[f"videos/{VIDEO}/file_index"]))
    for files in (data_files, video_files):
        assert len(set(files)) >= 2 and len(set(files)) < len(files)  # several files, some shared
        assert max(c for c, _ in files) >= 1  # chunks_size=2 rolls into chunk-001
    assert len(list((root / "meta/episodes").glob("*/*.parquet"))) >= 1
    # the image column is an HF Image struct of PNG bytes, as LeRobot stores it
    first = pq.read_table(root / "data/chunk-000/file-000.parquet", columns=[IMAGE])[IMAGE][0].as_py()
    assert set(first) == {"bytes", "path"} and first["bytes"].startswith(b"\x89PNG")


def test_every_frame_has_its_values_and_task(dataset: LeRobotDataset) -> None:
    assert len(dataset) == sum(LENGTHS) and dataset.num_episodes == len(LENGTHS)
    for ep, (start, length) in enumerate(zip(_starts(), LENGTHS)):
        for t in range(length):
            item = dataset[start + t]
            assert item["index"].item() == start + t and item["episode_index"].item() == ep
            assert item["frame_index"].item() == t and item["timestamp"].item() == pytest.approx(t / FPS)
            assert item["task"] == TASKS[ep % 2] and item["task_index"].item() == ep % 2
            assert item["observation.joint"].dtype == torch.float64
            assert item["observation.joint"].tolist() == pytest.approx([t * 1e-9, t + 0.25], abs=0)
            assert item["next.done"].dtype == torch.bool and item["next.done"].item() == (t == length - 1)
            # shape [1] features are scalar columns, returned as 0-d tensors like LeRobot's
            assert item["observation.step"].shape == () and item["observation.step"].item() == 3 * t


def test_delta_windows_clamp_and_pad_at_episode_boundaries(dataset: LeRobotDataset) -> None:
    for ep, (start, length) in enumerate(zip(_starts(), LENGTHS)):
        for t in range(length):
            item = dataset[start + t]
            wanted = np.array([t - 2, t - 1, t, t + 1])
            clamped = np.clip(wanted, 0, length - 1)
            assert item["observation.state"][:, 0].tolist() == (ep * 100 + clamped).tolist()
            assert item["observation.state_is_pad"].tolist() == ((wanted < 0) | (wanted >= length)).tolist()
            wanted = np.array([t, t + 1, t + 2])
            assert (
                item["action"][:, 0].tolist() == (ep * 100 + np.clip(wanted, 0, length - 1) + 1000).tolist()
            )
            assert item["action_is_pad"].tolist() == (wanted >= length).tolist()


def test_image_feature_round_trips_exactly(dataset: LeRobotDataset) -> None:
    for ep, start in ((0, 0), (4, _starts()[4])):
        item = dataset[start + 2]
        image = item[IMAGE]
        assert image.shape == (3, 24, 32) and image.dtype == torch.float32
        assert torch.equal(
            (image * 255).round().to(torch.uint8).permute(1, 2, 0), torch.from_numpy(_image_frame(ep, 2))
        )


def test_decoded_video_frame_is_the_written_one(dataset: LeRobotDataset) -> None:
    for ep, (start, length) in enumerate(zip(_starts(), LENGTHS)):
        written = np.stack([_video_frame(ep, t) for t in range(length)]) / 255.0
        for t in range(length):
            frame = dataset[start + t][VIDEO]
            assert frame.shape == (3, 32, 48) and 0.0 <= frame.min() and frame.max() <= 1.0
            errors = np.abs(written - frame.permute(1, 2, 0).numpy()).mean(axis=(1, 2, 3))
            assert errors[t] < 0.03, (ep, t, errors[t])  # within codec tolerance
            assert errors.argmin() == t  # and not a neighbouring frame


def test_video_windows_follow_delta_timestamps(root: Path) -> None:
    ds = LeRobotDataset(root, delta_timestamps={VIDEO: [-0.1, 0.0, 0.1]})
    ep, start, length = 3, _starts()[3], LENGTHS[3]
    item = ds[start + length - 1]
    assert item[VIDEO].shape == (3, 3, 32, 48)
    assert item[f"{VIDEO}_is_pad"].tolist() == [False, False, True]
    written = [_video_frame(ep, t) / 255.0 for t in (length - 2, length - 1, length - 1)]
    for got, want in zip(item[VIDEO], written):
        assert np.abs(got.permute(1, 2, 0).numpy() - want).mean() < 0.03


def test_uint8_cameras_become_the_float_ones_bit_for_bit(root: Path, dataset: LeRobotDataset) -> None:
    """``return_uint8`` (what training loads): video and image cameras as uint8 CHW, windows too, and
    ``cameras_to_float`` gives exactly the float items; every other entry is the same."""
    delta = {"action": [0.0, 0.1], VIDEO: [-0.1, 0.0]}
    as_float = LeRobotDataset(root, delta_timestamps=delta)
    as_bytes = LeRobotDataset(root, delta_timestamps=delta, return_uint8=True)
    for row in (0, _starts()[3] + 1, len(as_float) - 1):
        want, got = as_float[row], as_bytes[row]
        assert got[VIDEO].dtype == got[IMAGE].dtype == torch.uint8
        assert got[VIDEO].shape == (2, 3, 32, 48) and got[IMAGE].shape == (3, 24, 32)
        converted = cameras_to_float(got, [VIDEO, IMAGE])
        assert set(converted) == set(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == converted[key].dtype and torch.equal(value, converted[key]), key
            else:
                assert value == converted[key], key


def test_episode_selection(root: Path) -> None:
    ds = LeRobotDataset(root, episodes=[4, 1], delta_timestamps={"action": [0.0, 0.1]})
    assert len(ds) == LENGTHS[1] + LENGTHS[4] and ds.num_episodes == 2 and ds.meta.num_frames == len(ds)
    assert ds.meta.total_episodes == len(LENGTHS)  # the full dataset's size stays available
    assert [ds[i]["episode_index"].item() for i in range(len(ds))] == [1] + [4] * LENGTHS[4]
    assert ds[0]["action_is_pad"].tolist() == [False, True]  # the 1-frame episode pads at once
    last = ds[len(ds) - 1]
    assert last["index"].item() == _starts()[4] + LENGTHS[4] - 1 and last["action_is_pad"].tolist() == [
        False,
        True,
    ]
    frame = ds[1][VIDEO].permute(1, 2, 0).numpy()
    assert np.abs(frame - _video_frame(4, 0) / 255.0).mean() < 0.03
    with pytest.raises(DatasetError, match=r"\[99\] not in"):
        LeRobotDataset(root, episodes=[1, 99])


def test_dataloader_workers_match_single_process(dataset: LeRobotDataset) -> None:
    batches = {}
    for workers in (0, 2):
        loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=workers)
        batches[workers] = list(loader)
    assert len(batches[0]) == len(batches[2])
    for a, b in zip(batches[0], batches[2]):
        assert a["task"] == b["task"]
        for key in (VIDEO, IMAGE, "action", "action_is_pad", "observation.state", "index"):
            assert torch.equal(a[key], b[key]), key


def test_seek_that_lands_after_the_wanted_frame_is_retried(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some demuxers seek to a key frame past the target; the decoder must notice and seek earlier."""
    from lerobot_cli.datasets import video

    real_container, seeks = video._container, []

    class OvershootingFirstSeek:
        def __init__(self, container) -> None:
            self._container = container

        def __getattr__(self, name: str):
            return getattr(self._container, name)

        def seek(self, offset: int, **kwargs) -> None:
            seeks.append(offset)
            if len(seeks) == 1:  # land 0.5 s late, once
                offset += int(0.5 / float(self._container.streams.video[0].time_base))
            self._container.seek(offset, **kwargs)

    monkeypatch.setattr(video, "_container", lambda path: OvershootingFirstSeek(real_container(path)))
    frame = LeRobotDataset(root)[_starts()[3]][VIDEO]
    assert len(seeks) == 2 and seeks[1] < seeks[0]
    assert np.abs(frame.permute(1, 2, 0).numpy() - _video_frame(3, 0) / 255.0).mean() < 0.03
