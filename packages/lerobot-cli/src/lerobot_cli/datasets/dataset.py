"""``LeRobotDataset``: a torch Dataset over a LeRobot v3.0 dataset directory.

Items are what LeRobot's own ``LeRobotDataset.__getitem__`` returns, so policies and processors written
against LeRobot see the same keys, shapes and dtypes: every feature as a tensor (cameras float32 CHW in
[0, 1]), ``timestamp``/``frame_index``/``episode_index``/``index``/``task_index``, the ``task`` string, and
for each delta_timestamps key a stacked window plus a ``<key>_is_pad`` mask.

``return_uint8=True`` (what LeRobot's training factory asks for, and ``make_dataset``) gives cameras as
uint8 CHW instead: a quarter of the bytes through the DataLoader's shared memory and to the device, where
the trainer divides by 255 (:func:`cameras_to_float`), which gives the same float32 values bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.config import DatasetConfig
from lerobot_cli.datasets.errors import DatasetError
from lerobot_cli.datasets.hub import resolve_dataset_root
from lerobot_cli.datasets.images import decode_image
from lerobot_cli.datasets.metadata import DatasetMeta, MetaView, image_file, load_meta, visual_chw
from lerobot_cli.datasets.shared import SharedBinary, release_freed_memory, shared_tensor
from lerobot_cli.datasets.tabular import load_frames
from lerobot_cli.datasets.video import decode_frames, probe_video

DEFAULT_TOLERANCE_S = 1e-4  # LeRobot's default for both delta_timestamps and decoded frame times
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}  # (pid, threads): this process's camera decoders
_threads: dict[tuple[int, int], int] = {}  # (pid, cameras): camera_threads' answer in this process


def camera_threads(cameras: int) -> int:
    """How many cameras of an item decode at once: the cores this process may use, shared among the
    DataLoader's workers (each a process decoding its own items), at most one per camera. One worker per
    core decodes serially; fewer workers than cores put the spare cores to work (the decoder itself runs
    on one thread: see video.py). Worked out once per process and camera count."""
    key = (os.getpid(), cameras)
    if key not in _threads:
        _threads[key] = _camera_threads(cameras)
    return _threads[key]


def _camera_threads(cameras: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    info = torch.utils.data.get_worker_info()
    workers = info.num_workers if info is not None else 1
    return max(1, min(cameras, cores // max(1, workers)))


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's pool (a forked worker makes its own: threads do not survive a fork)."""
    key = (os.getpid(), threads)
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix="camera-decode")
    return pool


def _delta_indices(
    meta: DatasetMeta, delta_timestamps: Mapping[str, Sequence[float]] | None, tolerance_s: float
) -> dict[str, np.ndarray]:
    """Frame offsets per key; each delta must be a multiple of 1/fps, as LeRobot checks."""
    out: dict[str, np.ndarray] = {}
    info = meta.root / L.INFO_PATH
    for key, deltas in (delta_timestamps or {}).items():
        if key not in meta.features:
            raise DatasetError(
                f"delta_timestamps key {key!r} is not a feature of {info} (features: {list(meta.features)})"
            )
        seconds = np.asarray(list(deltas), dtype=np.float64)
        if seconds.ndim != 1 or len(seconds) == 0:
            raise DatasetError(
                f"delta_timestamps[{key!r}] must be a non-empty list of seconds, got {deltas!r}"
            )
        frames = np.round(seconds * meta.fps)
        off = np.abs(seconds - frames / meta.fps) > tolerance_s
        if off.any():
            raise DatasetError(
                f"delta_timestamps[{key!r}] has {seconds[off].tolist()}, not multiples of 1/fps = "
                f"1/{meta.fps} ({info}) within {tolerance_s} s"
            )
        out[key] = frames.astype(np.int64)
    return out


class LeRobotDataset(MetaView, torch.utils.data.Dataset):
    """Frames of the selected ``episodes`` of the dataset at ``root`` (all episodes when None).

    Tabular data is loaded once into contiguous tensors; videos are decoded per item from files kept open
    per process, so DataLoader workers (fork or spawn) each decode independently.
    """

    def __init__(
        self,
        root: str | Path,
        episodes: Sequence[int] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        return_uint8: bool = False,
    ) -> None:
        super().__init__()
        self.root = Path(root)
        self.return_uint8 = return_uint8
        self.meta: DatasetMeta = load_meta(self.root).select(None if episodes is None else list(episodes))
        self.tolerance_s = tolerance_s
        self.delta_timestamps = dict(delta_timestamps) if delta_timestamps else None
        self.delta_indices = _delta_indices(self.meta, delta_timestamps, tolerance_s)
        table = load_frames(self.meta)
        # Everything per frame or per episode that items read lives in shared memory (see shared.py):
        # a DataLoader worker's memory then follows the items it reads, not the dataset's length.
        self._columns = {k: shared_tensor(v) for k, v in table.columns.items()}
        self._index = self._as_int64("index", table.columns)
        self._task_index = self._as_int64("task_index", table.columns)
        self._image_bytes = {k: SharedBinary(v) for k, v in table.image_bytes.items()}
        self._image_paths = table.image_paths
        self._ep_pos = shared_tensor(table.ep_pos)
        self._ep_start = shared_tensor(table.ep_start)
        episodes = self.meta.episodes
        self._ep_from = shared_tensor(episodes[L.EP_FROM].astype(np.int64))
        self._ep_to = shared_tensor(episodes[L.EP_TO].astype(np.int64))
        self._ep_index = shared_tensor(episodes[L.EP_INDEX].astype(np.int64))
        del table
        release_freed_memory()
        self._chw = {k: visual_chw(k, self.meta.features[k]) for k in self.meta.camera_keys}
        # per camera: the distinct video files, and which one each episode's frames are in
        self._video_paths: dict[str, list[str]] = {}
        self._video_file: dict[str, torch.Tensor] = {}
        self._video_from: dict[str, torch.Tensor] = {}
        for key in self.meta.video_keys:
            files = [str(self.meta.video_file(p, key)) for p in range(self.meta.num_episodes)]
            self._video_paths[key] = list(dict.fromkeys(files))
            slot = {path: i for i, path in enumerate(self._video_paths[key])}
            self._video_file[key] = shared_tensor(np.asarray([slot[f] for f in files], dtype=np.int64))
            self._video_from[key] = shared_tensor(
                episodes[L.video_column(key, "from_timestamp")].astype(np.float64)
            )
            self._check_videos(key)

    def _as_int64(self, key: str, columns: dict[str, np.ndarray]) -> torch.Tensor:
        """The column ``key`` as int64: the item's own tensor when info.json declares it so (LeRobot
        does), else a shared copy (one array less for every item to touch)."""
        column = self._columns[key]
        return column if column.dtype == torch.int64 else shared_tensor(columns[key].astype(np.int64))

    def _check_videos(self, key: str) -> None:
        """Every video file exists and has the frame size info.json declares (before any worker forks)."""
        check_video_channels(self.meta, key, self._chw[key])
        for path in self._video_paths[key]:
            check_video_file(path, key, self._chw[key])

    @property
    def num_frames(self) -> int:
        return len(self._ep_pos)

    def rows_without_last(self, n: int) -> np.ndarray:
        """The rows that are not among the last ``n`` frames of their episode (LeRobot's
        ``drop_n_last_frames``: such frames never start a training sample), in dataset order."""
        lengths = self.meta.episodes[L.EP_LENGTH].astype(np.int64)
        ep_pos = self._ep_pos.numpy()
        offset = np.arange(len(ep_pos)) - self._ep_start.numpy()[ep_pos]
        return np.flatnonzero(offset < lengths[ep_pos] - n)

    @property
    def task_index(self) -> np.ndarray:
        """Each frame's task index, in dataset order (the held-out cap selects frames per task)."""
        return self._task_index.numpy().copy()

    def __len__(self) -> int:
        return len(self._ep_pos)

    def __repr__(self) -> str:
        return (
            f"LeRobotDataset(root={str(self.root)!r}, episodes={self.num_episodes}, "
            f"frames={self.num_frames}, features={list(self.features)})"
        )

    def _image(self, key: str, row: int) -> np.ndarray:
        data = self._image_bytes[key].get(row)
        paths = self._image_paths[key]
        named = paths[row].as_py() if data is None and paths is not None else None
        pos = int(self._ep_pos[row])
        return load_image(self.meta, key, self._chw[key], data, named, pos, int(self._index[row]))

    def __getitem__(self, idx: int) -> dict:
        row = int(idx)
        if not 0 <= row < len(self._ep_pos):
            raise IndexError(f"index {idx} out of range for a dataset of {len(self._ep_pos)} frames")
        pos = int(self._ep_pos[row])
        return build_item(
            self.meta,
            self._columns,
            row,
            int(self._ep_start[pos]),
            (int(self._ep_from[pos]), int(self._ep_to[pos])),
            int(self._index[row]),
            int(self._task_index[row]),
            self.delta_indices,
            self._image,
            lambda key: (
                self._video_paths[key][int(self._video_file[key][pos])],
                float(self._video_from[key][pos]),
            ),
            int(self._ep_index[pos]),
            self.tolerance_s,
            self.return_uint8,
        )


def check_video_channels(meta: DatasetMeta, key: str, chw: tuple[int, int, int]) -> None:
    if chw[0] != 3:
        raise DatasetError(
            f"{meta.root / L.INFO_PATH}: video {key!r} has {chw[0]} channels; only RGB (3) is supported"
        )


def check_video_file(path, key: str, chw: tuple[int, int, int]) -> None:
    """The video file (a local path, or a streamed file: ``video.RemoteVideo``) exists and has the frame
    size info.json declares."""
    _, height, width = chw
    if isinstance(path, str) and not Path(path).is_file():
        raise DatasetError(f"missing file {path}: meta/episodes points episodes of {key!r} at it")
    size = probe_video(path)
    if size != (height, width):
        raise DatasetError(
            f"video file {path} has frames of {size[0]}x{size[1]} (HxW), but meta/info.json declares "
            f"{key!r} as {height}x{width} (shape mismatch)"
        )


def to_chw(frames: np.ndarray, single: bool, return_uint8: bool) -> torch.Tensor:
    """uint8 (T, H, W, C) -> float32 (T, C, H, W) in [0, 1], or uint8 (T, C, H, W) with
    ``return_uint8`` (without T when ``single``)."""
    tensor = torch.from_numpy(frames).permute(0, 3, 1, 2)
    if return_uint8:
        tensor = tensor.contiguous()
    else:
        tensor = tensor.to(torch.float32, memory_format=torch.contiguous_format).div_(255.0)
    return tensor[0] if single else tensor


def load_image(
    meta: DatasetMeta,
    key: str,
    chw: tuple[int, int, int],
    data: bytes | None,
    named: str | None,
    pos: int,
    index: int,
) -> np.ndarray:
    """The HWC image of the frame at row ``index`` of the episode at row ``pos`` of ``meta.episodes``:
    decoded from ``data``, or from the file ``named`` (relative to the root, which it must stay inside)
    when the row has no bytes; checked against the shape info.json declares."""
    data_file = meta.data_file(pos)
    where = f"{data_file} ({key!r}, row index {index})"
    if (
        data is None and named
    ):  # a path the parquet file names: it must stay inside the dataset, as every file
        path = image_file(meta.root, named, named_by=data_file)
        data = path.read_bytes() if path.is_file() else None
    if data is None:
        raise DatasetError(f"{where}: image has neither bytes nor a readable path")
    try:
        image = decode_image(data)
    except ValueError as err:
        raise DatasetError(f"{where}: {err}") from err
    c, h, w = chw
    if image.shape != (h, w, c):
        raise DatasetError(
            f"{where}: image is {image.shape} (HWC), but meta/info.json declares {(h, w, c)} (shape mismatch)"
        )
    return image


def build_item(
    meta: DatasetMeta,
    columns: Mapping[str, torch.Tensor],
    row: int,
    start: int,
    span: tuple[int, int],
    absolute: int,
    task_index: int,
    delta_indices: Mapping[str, np.ndarray],
    image: Callable[[str, int], np.ndarray],
    video: Callable[[str], tuple[str, float]],
    episode: int,
    tolerance_s: float,
    return_uint8: bool,
) -> dict:
    """The item of the frame at ``row`` of ``columns`` (shared by :class:`LeRobotDataset` and
    :class:`~lerobot_cli.datasets.episode_reader.EpisodeReader`).

    ``columns`` holds the numeric features row-aligned, its episode's frames contiguous from ``start``;
    ``span`` is the episode's [dataset_from_index, dataset_to_index) and ``absolute`` the frame's
    ``index``. ``image(key, row)`` gives a row's HWC image; ``video(key)`` the episode's video file and
    from_timestamp for a video camera."""
    first, end = span
    item: dict = {key: col[row].clone() for key, col in columns.items()}
    rows: dict[str, np.ndarray] = {}
    for key, deltas in delta_indices.items():
        wanted = absolute + deltas
        rows[key] = start + (np.clip(wanted, first, end - 1) - first)
        item[f"{key}_is_pad"] = torch.from_numpy((wanted < first) | (wanted >= end))
        if key in columns:
            item[key] = columns[key][torch.from_numpy(rows[key])]
    for key in meta.image_keys:
        picks = rows.get(key, np.asarray([row]))
        item[key] = to_chw(np.stack([image(key, int(r)) for r in picks]), key not in rows, return_uint8)

    def decode(key: str) -> torch.Tensor:
        picks = torch.from_numpy(rows.get(key, np.asarray([row])))
        path, from_timestamp = video(key)
        times = columns["timestamp"][picks].double() + from_timestamp
        what = f" ({key!r}, episode {episode})"
        frames = decode_frames(path, times.tolist(), tolerance_s, what)
        return to_chw(frames, key not in rows, return_uint8)

    videos = meta.video_keys
    threads = camera_threads(len(videos)) if len(videos) > 1 else 1
    decoded = _pool(threads).map(decode, videos) if threads > 1 else map(decode, videos)
    item.update(zip(videos, decoded, strict=True))
    if task_index not in meta.tasks:
        raise DatasetError(
            f"{meta.root / L.TASKS_PATH} has no task_index {task_index} (used by row index {absolute})"
        )
    item["task"] = meta.tasks[task_index]
    return item


def make_dataset(
    cfg: DatasetConfig,
    delta_timestamps: Mapping[str, Sequence[float]] | None = None,
    return_uint8: bool = False,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> LeRobotDataset:
    """The dataset ``--dataset.*`` names: resolved locally or downloaded,
    then ``--dataset.episodes`` applied."""
    return LeRobotDataset(
        resolve_dataset_root(cfg),
        episodes=cfg.episodes,
        delta_timestamps=delta_timestamps,
        return_uint8=return_uint8,
        tolerance_s=tolerance_s,
    )


def cameras_to_float(batch: dict, camera_keys: Sequence[str]) -> dict:
    """``batch`` with every uint8 camera tensor as float32 in [0, 1] (``x.float() / 255``, the values
    ``return_uint8=False`` gives, bit for bit); other entries unchanged. Runs wherever the batch is: on
    the device after placement, the division costs the host nothing."""
    out = dict(batch)
    for key in camera_keys:
        value = out.get(key)
        if isinstance(value, torch.Tensor) and value.dtype == torch.uint8:
            out[key] = value.to(torch.float32).div_(255.0)
    return out
