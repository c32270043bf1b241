"""``EpisodeReader``: the items of a LeRobot v3.0 dataset read one episode at a time, on demand.

Where :class:`~lerobot_cli.datasets.dataset.LeRobotDataset` loads every selected frame's columns at
start-up, this reads only ``meta/`` then, and per :meth:`EpisodeReader.read` only the row groups of the
episode's data file that hold its rows: memory follows the episodes being read, not the dataset's frame
count. It is what a streaming source (``lerobot_trainloop.streaming.StreamingDataSource``) calls as
``read(episode, frames)``. Items are built by the same code as LeRobotDataset's
(:func:`~lerobot_cli.datasets.dataset.build_item`), so they are the same bit for bit.

Row groups are picked with the min/max statistics of the ``index`` column in the file's footer (a
streaming reader then reads no byte of another episode's row groups); a file whose footer lacks them
has its ``index`` column read once instead, and the per-row-group ranges worked out from it. Either way
only those ranges (two ints per row group) are kept per file.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from attrs import define

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.dataset import (
    DEFAULT_TOLERANCE_S,
    _delta_indices,
    build_item,
    check_video_channels,
    check_video_file,
    load_image,
)
from lerobot_cli.datasets.errors import DatasetError
from lerobot_cli.datasets.metadata import DatasetMeta, MetaView, _is_file, load_meta, visual_chw
from lerobot_cli.datasets.tabular import check_columns, episode_rows, numeric_features, only_episodes

log = logging.getLogger(__name__)
WIDE_ROW_GROUP = 4  # a row group this many times an episode's length or more: read mostly for nothing


@define(frozen=True, eq=False)
class _Episode:
    """One episode's rows, in frame order: numeric columns as tensors, (bytes, paths) image columns,
    and per video camera its file and from_timestamp."""

    columns: dict[str, torch.Tensor]
    task_index: np.ndarray
    images: dict[str, tuple[pa.Array, pa.Array | None]]
    videos: dict[str, tuple[str | FileRef, float]]


class Files(Protocol):
    """Where a streamed dataset's files are read from (``remote.RemoteDataset``): ``url`` names it in
    messages, ``open(relpath)`` gives a binary file object with range reads."""

    url: str

    def open(self, relpath: str) -> BinaryIO: ...


@define(frozen=True, eq=False)
class FileRef:
    """A file of a streamed dataset: opened through ``files`` (parquet and video readers take the file
    object); named by its URL."""

    files: Files
    relpath: str

    def open(self) -> BinaryIO:
        return self.files.open(self.relpath)

    def __str__(self) -> str:
        return f"{self.files.url.rstrip('/')}/{self.relpath}"


DataFile = Path | FileRef


def _first_reader() -> bool:
    """Whether this process is the job's first reader (rank 0, its first worker or no worker): a
    warning about the data is said once, not by every reader."""
    info = torch.utils.data.get_worker_info()
    return os.environ.get("RANK", "0") == "0" and (info is None or info.id == 0)


def _parquet_error(path: DataFile, err: Exception) -> DatasetError:
    return DatasetError(f"cannot read parquet file {path}: {err}")


def _open(path: DataFile) -> pq.ParquetFile:
    if isinstance(path, FileRef):
        try:
            return pq.ParquetFile(path.open())
        except (pa.ArrowException, OSError) as err:
            raise _parquet_error(path, err) from err
    if not _is_file(path):
        raise DatasetError(f"missing file {path}: the dataset layout (meta/info.json) says it must exist")
    try:
        return pq.ParquetFile(path, memory_map=True)
    except (pa.ArrowException, OSError) as err:
        raise _parquet_error(path, err) from err


def read_row_groups(path: DataFile, row_groups: list[int], columns: list[str]) -> pa.Table:
    """``columns`` of the row groups ``row_groups`` of the parquet file ``path`` (one read per episode
    an :class:`EpisodeReader` loads; tests count them)."""
    try:
        return _open(path).read_row_groups(row_groups, columns=columns)
    except (pa.ArrowException, OSError) as err:
        raise _parquet_error(path, err) from err


def _index_ranges(path: DataFile, wanted: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per row group of ``path``: the min and max of its ``index`` column (after checking that the
    file has every ``wanted`` column)."""
    file = _open(path)
    check_columns(path, file.schema_arrow.names, wanted)
    meta = file.metadata
    # the parquet leaf column of ``index`` (list and struct columns have several leaves each)
    column = [meta.schema.column(i).path for i in range(meta.num_columns)].index("index")
    lows, highs = np.zeros(meta.num_row_groups, np.int64), np.full(meta.num_row_groups, -1, np.int64)
    missing = False
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(column).statistics
        if meta.row_group(group).num_rows == 0:
            continue  # nothing to read: an empty range
        if stats is None or not stats.has_min_max:
            missing = True
            break
        lows[group], highs[group] = int(stats.min), int(stats.max)
    if missing:  # no statistics: read the index column once and work the ranges out
        try:
            index = file.read(columns=["index"])["index"].to_numpy()
        except (pa.ArrowException, OSError) as err:
            raise _parquet_error(path, err) from err
        bounds = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        for group in range(meta.num_row_groups):
            part = index[bounds[group] : bounds[group + 1]]
            if len(part):
                lows[group], highs[group] = int(part.min()), int(part.max())
    return lows, highs


class EpisodeReader(MetaView):
    """Items of the selected ``episodes`` of the dataset at ``root`` (all when None), read per episode.

    ``read(episode, frames)`` gives, for the episode at position ``episode`` of the selection (the
    order of :attr:`lengths`) and frame offsets ``frames`` within it, the items
    ``LeRobotDataset(root, episodes, delta_timestamps, tolerance_s, return_uint8)`` gives for them. The
    last ``cache_episodes`` episodes read keep their rows (a stream walks episodes in turn, and a
    shuffle buffer mixes frames of a few recent ones).

    ``files``: read the data and video files through it (a streamed dataset, ``remote.RemoteDataset``),
    ``root`` then being the local copy of its ``meta/``; None: the files under ``root``.
    """

    def __init__(
        self,
        root: str | Path,
        episodes: Sequence[int] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        return_uint8: bool = False,
        cache_episodes: int = 8,
        files: Files | None = None,
    ) -> None:
        if cache_episodes < 0:
            raise ValueError(f"cache_episodes must be >= 0, got {cache_episodes}")
        self.root = Path(root)
        self.files = files
        self.return_uint8 = return_uint8
        self.tolerance_s = tolerance_s
        self.cache_episodes = cache_episodes
        self.meta: DatasetMeta = load_meta(self.root).select(None if episodes is None else list(episodes))
        self.delta_timestamps = dict(delta_timestamps) if delta_timestamps else None
        self.delta_indices = _delta_indices(self.meta, delta_timestamps, tolerance_s)
        eps = self.meta.episodes
        self.lengths: list[int] = eps[L.EP_LENGTH].astype(np.int64).tolist()
        self._from: list[int] = eps[L.EP_FROM].astype(np.int64).tolist()
        self._to: list[int] = eps[L.EP_TO].astype(np.int64).tolist()
        self._ep_index: list[int] = eps[L.EP_INDEX].astype(np.int64).tolist()
        self._chw = {k: visual_chw(k, self.meta.features[k]) for k in self.meta.camera_keys}
        for key in self.meta.video_keys:
            check_video_channels(self.meta, key, self._chw[key])
        self._numeric = numeric_features(self.meta)
        self._wanted = list(self._numeric) + self.meta.image_keys
        self._files: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # per data file: index ranges
        self._videos_checked: set[str] = set()
        self._wide_warned: set[str] = set()
        self._cache: OrderedDict[int, _Episode] = OrderedDict()

    @property
    def cached_episodes(self) -> list[int]:
        """The episodes whose rows are held, least recently read first."""
        return list(self._cache)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = OrderedDict()  # a worker reads its own episodes
        return state

    def __repr__(self) -> str:
        return (
            f"EpisodeReader(root={str(self.root)!r}, episodes={self.num_episodes}, "
            f"frames={sum(self.lengths)}, features={list(self.features)})"
        )

    def read(self, episode: int, frames: Sequence[int]) -> list[dict]:
        """The items of frames ``frames`` (offsets) of the episode at position ``episode``."""
        pos = int(episode)
        if not 0 <= pos < len(self.lengths):
            raise IndexError(
                f"episode {episode} out of range for a selection of {len(self.lengths)} episodes"
            )
        length = self.lengths[pos]
        offsets = [int(f) for f in frames]
        bad = [f for f in offsets if not 0 <= f < length]
        if bad:
            raise IndexError(f"frames {bad[:5]} out of range for episode {pos} of {length} frames")
        data = self._episode(pos)
        span = (self._from[pos], self._to[pos])

        def image(key: str, row: int) -> np.ndarray:
            values, paths = data.images[key]
            blob = values[row].as_py()
            named = paths[row].as_py() if blob is None and paths is not None else None
            return load_image(self.meta, key, self._chw[key], blob, named, pos, span[0] + row)

        return [
            build_item(
                self.meta,
                data.columns,
                f,
                0,
                span,
                span[0] + f,
                int(data.task_index[f]),
                self.delta_indices,
                image,
                data.videos.__getitem__,
                self._ep_index[pos],
                self.tolerance_s,
                self.return_uint8,
            )
            for f in offsets
        ]

    def _episode(self, pos: int) -> _Episode:
        cached = self._cache.get(pos)
        if cached is not None:
            self._cache.move_to_end(pos)
            return cached
        data = self._load(pos)
        if self.cache_episodes:
            self._cache[pos] = data
            while len(self._cache) > self.cache_episodes:
                self._cache.popitem(last=False)
        return data

    def _file(self, path: Path) -> DataFile:
        """A file the metadata names (checked to lie inside the root): local, or read through ``files``."""
        if self.files is None:
            return path
        return FileRef(self.files, path.relative_to(self.root).as_posix())

    def _row_groups(self, path: DataFile, first: int, end: int) -> list[int]:
        """The row groups of ``path`` whose ``index`` range overlaps [first, end)."""
        if str(path) not in self._files:
            self._files[str(path)] = _index_ranges(path, self._wanted)
        lows, highs = self._files[str(path)]
        groups = np.flatnonzero((lows < end) & (highs >= first)).tolist()
        rows = int(sum(highs[g] - lows[g] + 1 for g in groups))
        wide = rows >= WIDE_ROW_GROUP * (end - first) and rows > 1000
        if wide and str(path) not in self._wide_warned and _first_reader():
            self._wide_warned.add(str(path))
            log.warning(
                "%s keeps %d frames in the row group(s) of an episode of %d: each episode read from it "
                "reads them all. LeRobot 0.6 writes one row group per episode; a dataset rewritten that "
                "way streams without the waste",
                path,
                rows,
                end - first,
            )
        return groups

    def _load(self, pos: int) -> _Episode:
        path = self._file(self.meta.data_file(pos))
        first, end, ep = self._from[pos], self._to[pos], self._ep_index[pos]
        table = read_row_groups(path, self._row_groups(path, first, end), self._wanted)
        table = only_episodes(table, [ep])
        columns, images = episode_rows(path, table, self._numeric, self.meta.image_keys, [ep], [first], [end])
        del table
        tensors = {
            k: torch.from_numpy(v if v.flags.writeable and v.flags.c_contiguous else np.array(v))
            for k, v in columns.items()
        }
        videos: dict[str, tuple[str | FileRef, float]] = {}
        for key in self.meta.video_keys:
            named = self._file(self.meta.video_file(pos, key))
            video = named if isinstance(named, FileRef) else str(named)
            if str(video) not in self._videos_checked:
                check_video_file(video, key, self._chw[key])
                self._videos_checked.add(str(video))
            from_timestamp = float(self.meta.episodes[L.video_column(key, "from_timestamp")][pos])
            videos[key] = (video, from_timestamp)
        return _Episode(tensors, columns["task_index"].astype(np.int64), images, videos)
