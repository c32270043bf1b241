"""A LeRobot v3.0 writer for datasets produced in one go (simulation, tests, conversions).

It writes what LeRobot's recording path writes (``LeRobotDataset.create`` + ``save_episode`` +
``finalize``): data parquet with HF ``datasets`` column types and one row group per episode, episodes
appended to shared data/video files until the size limits are reached, meta/episodes with per-episode
stats, tasks.parquet in pandas' layout, stats.json and info.json. Torch-free.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from attrs import define, field

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.images import encode_png
from lerobot_cli.datasets.mp4 import VCODECS, Mp4Concatenator, encode_episode, video_info
from lerobot_cli.datasets.stats import aggregate_stats, episode_stats, to_json

_MB = 1024**2


@define(frozen=True)
class EpisodeData:
    """One episode: ``frames`` maps each feature to a (T, *shape) array; cameras are uint8 (T, H, W, 3)."""

    task: str
    frames: dict[str, np.ndarray] = field(repr=False)


def _hf_feature(ft: dict) -> dict:
    """The HF ``datasets`` feature LeRobot declares for a column (kept in the parquet schema metadata)."""
    if ft["dtype"] == "image":
        return {"_type": "Image"}
    value = {"dtype": ft["dtype"], "_type": "Value"}
    if tuple(ft["shape"]) == (1,):
        return value
    return {"feature": value, "length": int(ft["shape"][0]), "_type": "Sequence"}


_IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _arrow_type(ft: dict) -> pa.DataType:
    """Arrow type of HF ``datasets``' Image / Value / Sequence(length=n) for this feature."""
    if ft["dtype"] == "image":
        return _IMAGE_TYPE
    value = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
    return value if tuple(ft["shape"]) == (1,) else pa.list_(value, int(ft["shape"][0]))


def _arrow_column(values: np.ndarray, ft: dict, frame_index: np.ndarray) -> pa.Array:
    if ft["dtype"] == "image":
        names = [f"frame-{i:06d}.png" for i in frame_index]
        return pa.array(
            [{"bytes": encode_png(v), "path": n} for v, n in zip(values, names, strict=True)],
            type=_IMAGE_TYPE,
        )
    flat = pa.array(np.ascontiguousarray(values).reshape(-1).astype(ft["dtype"]))
    if tuple(ft["shape"]) == (1,):
        return flat
    return pa.FixedSizeListArray.from_arrays(flat, int(ft["shape"][0]))


def _check_features(features: dict[str, dict]) -> dict[str, dict]:
    out = {}
    for key, ft in features.items():
        if "/" in key:
            raise ValueError(f"feature names cannot contain '/': {key!r}")
        shape = tuple(ft["shape"])
        if ft["dtype"] in L.VISUAL_DTYPES:
            if len(shape) != 3 or shape[2] != 3:
                raise ValueError(f"camera {key!r} needs shape (H, W, 3), got {shape}")
            ft = {**ft, "names": ["height", "width", "channels"]}
        elif ft["dtype"] not in L.NUMERIC_DTYPES or len(shape) != 1:
            raise ValueError(
                f"feature {key!r}: the writer supports 1-D numeric vectors and cameras, got {ft}"
            )
        out[key] = {
            "dtype": ft["dtype"],
            "shape": list(shape),
            "names": ft.get("names"),
            **{k: v for k, v in ft.items() if k not in ("dtype", "shape", "names")},
        }
    return {**out, **{k: dict(v) for k, v in L.DEFAULT_FEATURES.items()}}


def _group_sizes(sizes: list[float], limit_mb: float) -> list[int]:
    """File number of each item when items are appended until ``current + next >= limit`` (LeRobot's rule)."""
    groups, current, number = [], 0.0, 0
    for size in sizes:
        if current > 0 and current + size >= limit_mb:
            number, current = number + 1, 0.0
        groups.append(number)
        current += size
    return groups


def _file_indices(number: int, chunks_size: int) -> tuple[int, int]:
    chunk, file = 0, 0
    for _ in range(number):
        chunk, file = L.update_chunk_file_indices(chunk, file, chunks_size)
    return chunk, file


def _table_mb(table: pa.Table) -> float:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="snappy", use_dictionary=True)
    return sink.tell() / _MB


def _tasks_table(tasks: dict[str, int]) -> pa.Table:
    """tasks.parquet as ``pd.DataFrame({"task_index": ...}, index=tasks).to_parquet()`` writes it."""
    table = pa.table(
        {
            "task_index": pa.array(list(tasks.values()), pa.int64()),
            "__index_level_0__": pa.array(list(tasks), pa.string()),
        }
    )
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


@define(frozen=True)
class FileLimits:
    """How LeRobot v3.0 splits a dataset into files: files per chunk directory, MB per data/video file."""

    chunks_size: int = L.DEFAULT_CHUNK_SIZE
    data_files_size_in_mb: float = L.DEFAULT_DATA_FILE_SIZE_IN_MB
    video_files_size_in_mb: float = L.DEFAULT_VIDEO_FILE_SIZE_IN_MB


def write_dataset(
    root: str | Path,
    fps: int,
    features: dict[str, dict],
    episodes: Iterable[EpisodeData],
    *,
    robot_type: str | None = None,
    vcodec: str = "h264",
    limits: FileLimits = FileLimits(),  # noqa: B008 - frozen, so one shared default is safe
) -> Path:
    """Write a complete dataset into the new directory ``root`` and return it.

    ``features`` are the user features in LeRobot's info.json form ({dtype, shape, names}); the default
    columns are added. Small ``limits`` (``*_size_in_mb``) put several files in each directory (and with a
    small ``chunks_size`` several chunk directories), which is how tests exercise the multi-file layout.
    """
    chunks_size, data_files_size_in_mb = limits.chunks_size, limits.data_files_size_in_mb
    video_files_size_in_mb = limits.video_files_size_in_mb
    if vcodec not in VCODECS:
        raise ValueError(f"vcodec must be one of {VCODECS}, got {vcodec!r}")
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty; the writer only creates new datasets")
    features = _check_features(features)
    tabular = {k: ft for k, ft in features.items() if ft["dtype"] != "video"}
    video_keys = [k for k, ft in features.items() if ft["dtype"] == "video"]
    schema = pa.schema(
        [pa.field(k, _arrow_type(ft)) for k, ft in tabular.items()],
        metadata={
            b"huggingface": json.dumps(
                {"info": {"features": {k: _hf_feature(ft) for k, ft in tabular.items()}}}
            )
        },
    )
    tasks: dict[str, int] = {}
    rows: list[dict] = []
    all_stats: list[dict] = []
    data_writer, data_number, data_mb = None, -1, 0.0
    videos: dict[str, tuple[int, Mp4Concatenator]] = {}
    total = 0
    try:
        for episode_index, episode in enumerate(episodes):
            length = len(next(iter(episode.frames.values())))
            missing = set(features) - set(L.DEFAULT_FEATURES) - set(episode.frames)
            if missing or any(len(v) != length for v in episode.frames.values()) or length == 0:
                raise ValueError(
                    f"episode {episode_index}: needs {length or 'some'} frames of every feature, "
                    f"missing {missing}"
                )
            task_index = tasks.setdefault(episode.task, len(tasks))
            frame_index = np.arange(length)
            data = dict(episode.frames)
            data.update(
                timestamp=(frame_index / fps).astype(np.float32),
                frame_index=frame_index,
                episode_index=np.full(length, episode_index),
                index=total + frame_index,
                task_index=np.full(length, task_index),
            )
            table = pa.Table.from_arrays(
                [_arrow_column(data[k], ft, frame_index) for k, ft in tabular.items()], schema=schema
            )
            size = _table_mb(table)
            if data_writer is None or data_mb + size >= data_files_size_in_mb:
                if data_writer is not None:
                    data_writer.close()
                data_number, data_mb = data_number + 1, 0.0
                chunk, file = _file_indices(data_number, chunks_size)
                path = root / L.DEFAULT_DATA_PATH.format(chunk_index=chunk, file_index=file)
                path.parent.mkdir(parents=True, exist_ok=True)
                data_writer = pq.ParquetWriter(path, schema, compression="snappy", use_dictionary=True)
            data_writer.write_table(table)
            data_mb += size
            chunk, file = _file_indices(data_number, chunks_size)
            row = {
                L.EP_INDEX: episode_index,
                L.EP_TASKS: [episode.task],
                L.EP_LENGTH: length,
                L.EP_DATA_CHUNK: chunk,
                L.EP_DATA_FILE: file,
                L.EP_FROM: total,
                L.EP_TO: total + length,
            }
            for key in video_keys:
                blob = encode_episode(np.asarray(data[key], np.uint8), fps, vcodec)
                number, concat = videos.get(key, (-1, None))
                if concat is None or (concat.size + len(blob)) / _MB >= video_files_size_in_mb:
                    if concat is not None:
                        concat.close()
                    number += 1
                    chunk, file = _file_indices(number, chunks_size)
                    concat = Mp4Concatenator(
                        root / L.DEFAULT_VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
                    )
                    videos[key] = (number, concat)
                start, end = concat.append(blob)
                chunk, file = _file_indices(number, chunks_size)
                row.update(
                    {
                        L.video_column(key, "chunk_index"): chunk,
                        L.video_column(key, "file_index"): file,
                        L.video_column(key, "from_timestamp"): start,
                        L.video_column(key, "to_timestamp"): end,
                    }
                )
            stats = episode_stats(data, features)
            all_stats.append(stats)
            row.update({f"stats/{k}/{s}": v.tolist() for k, per in stats.items() for s, v in per.items()})
            rows.append(row)
            total += length
    finally:
        if data_writer is not None:
            data_writer.close()
        for _, concat in videos.values():
            concat.close()
    if not rows:
        raise ValueError("write_dataset needs at least one episode")
    for key in video_keys:
        features[key]["info"] = video_info(
            root / L.DEFAULT_VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        )
    _write_meta(root, rows, data_files_size_in_mb, chunks_size)
    pq.write_table(_tasks_table(tasks), root / L.TASKS_PATH)
    _write_json(root / L.STATS_PATH, to_json(aggregate_stats(all_stats)))
    info = {
        "codebase_version": L.CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": len(rows),
        "total_frames": total,
        "total_tasks": len(tasks),
        "chunks_size": chunks_size,
        "data_files_size_in_mb": data_files_size_in_mb,
        "video_files_size_in_mb": video_files_size_in_mb,
        "fps": fps,
        "splits": {"train": f"0:{len(rows)}"},
        "data_path": L.DEFAULT_DATA_PATH,
        "video_path": L.DEFAULT_VIDEO_PATH if video_keys else None,
        "features": features,
    }
    _write_json(root / L.INFO_PATH, info)
    return root


def _write_meta(root: Path, rows: list[dict], limit_mb: float, chunks_size: int) -> None:
    """meta/episodes files, split by the same size rule as data files."""
    per_row = _table_mb(pa.Table.from_pylist(rows)) / len(rows)
    numbers = _group_sizes([per_row] * len(rows), limit_mb)
    for number in sorted(set(numbers)):
        chunk, file = _file_indices(number, chunks_size)
        part = [
            dict(r, **{L.EP_META_CHUNK: chunk, L.EP_META_FILE: file})
            for r, n in zip(rows, numbers, strict=True)
            if n == number
        ]
        path = root / L.DEFAULT_EPISODES_PATH.format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(part), path, compression="snappy")


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False), encoding="utf-8")
