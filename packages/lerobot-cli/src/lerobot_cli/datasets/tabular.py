"""The ``data/`` parquet files of the selected episodes, loaded once into contiguous numpy columns.

Doing this once at start-up (instead of per item, as a row-wise reader would) means ``__getitem__`` only
indexes arrays: no per-item work grows with the dataset. Rows are checked against meta/episodes so that
episode boundaries used for delta_timestamps padding are the ones the data really has.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from attrs import define, field

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.errors import DatasetError
from lerobot_cli.datasets.metadata import DatasetMeta, read_parquet, read_schema


@define(frozen=True, eq=False)
class FrameTable:
    """Row-aligned columns of the selected frames, in dataset (``index``) order.

    ``columns`` holds every numeric feature plus timestamp/frame_index/episode_index/index/task_index;
    ``image_bytes`` / ``image_paths`` the encoded ``image`` features; ``ep_pos[row]`` is the row of
    ``meta.episodes`` the frame belongs to and ``ep_start[pos]`` that episode's first row here.
    """

    columns: dict[str, np.ndarray] = field(repr=False)
    image_bytes: dict[str, pa.Array] = field(repr=False)
    image_paths: dict[str, pa.Array | None] = field(repr=False)
    ep_pos: np.ndarray = field(repr=False)
    ep_start: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return len(self.ep_pos)


def _to_numpy(column: pa.ChunkedArray, key: str, feature: dict, path: Path) -> np.ndarray:
    """(N, *shape) array of a scalar or (nested, fixed or variable) list column, cast to the info dtype."""
    values = column.combine_chunks()
    rows = len(values)
    shape = tuple(feature["shape"])
    declared = f"meta/info.json declares {key!r} with shape {list(shape)}"
    depth = 0
    while (
        pa.types.is_list(values.type)
        or pa.types.is_large_list(values.type)
        or pa.types.is_fixed_size_list(values.type)
    ):
        if values.null_count:
            raise DatasetError(f"{path}: column {key!r} has {values.null_count} missing values")
        if depth >= len(shape):
            raise DatasetError(f"{path}: column {key!r} is nested deeper than {declared}")
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths.min() != shape[depth] or lengths.max() != shape[depth]):
            found = (
                f"{int(lengths.min())}"
                if lengths.min() == lengths.max()
                else f"{int(lengths.min())} to {int(lengths.max())}"
            )
            raise DatasetError(
                f"{path}: column {key!r} holds {found} values per frame along dim {depth}, "
                f"but {declared} (shape mismatch)"
            )
        values = values.flatten()
        depth += 1
    if values.null_count:
        raise DatasetError(f"{path}: column {key!r} has {values.null_count} missing values")
    if not (
        pa.types.is_integer(values.type)
        or pa.types.is_floating(values.type)
        or pa.types.is_boolean(values.type)
    ):
        raise DatasetError(
            f"{path}: column {key!r} holds {values.type}, but {declared} and dtype {feature['dtype']}"
        )
    array = values.to_numpy(zero_copy_only=False)
    if depth == 0:
        if math.prod(shape) != 1:
            raise DatasetError(
                f"{path}: column {key!r} holds one scalar per frame, but {declared} (shape mismatch)"
            )
    elif depth != len(shape) or array.size != rows * math.prod(shape):
        raise DatasetError(
            f"{path}: column {key!r} does not hold {list(shape)} values per frame as {declared}"
        )
    else:
        array = array.reshape((rows, *shape))
    return array.astype(np.dtype(feature["dtype"]), copy=False)


def _image_column(column: pa.ChunkedArray, key: str, path: Path) -> tuple[pa.Array, pa.Array | None]:
    """(bytes, paths) of an HF ``Image`` struct column {bytes, path} (or a bare binary column)."""
    values = column.combine_chunks()
    if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        return values, None
    if pa.types.is_struct(values.type):
        children = dict(zip([f.name for f in values.type], values.flatten(), strict=True))
        if "bytes" in children:
            return children["bytes"], children.get("path")
    raise DatasetError(
        f"{path}: image column {key!r} holds {values.type}; expected struct<bytes: binary, path: string>"
    )


def _check_rows(
    path: Path, columns: dict[str, np.ndarray], eps: list[int], froms: list[int], tos: list[int]
) -> None:
    """Rows must be exactly each episode's index range, in order (sorted here if only the order is off)."""
    expected = np.concatenate([np.arange(f, t) for f, t in zip(froms, tos, strict=True)])
    expected_ep = np.repeat(np.asarray(eps), np.asarray(tos) - np.asarray(froms))
    index = columns["index"]
    if len(index) == len(expected) and not np.array_equal(index, expected):
        order = np.argsort(index, kind="stable")
        for name in columns:
            columns[name] = columns[name][order]
        index = columns["index"]
    if not (np.array_equal(index, expected) and np.array_equal(columns["episode_index"], expected_ep)):
        raise DatasetError(
            f"{path}: rows of episodes {eps[:5]}{'...' if len(eps) > 5 else ''} do not match meta/episodes "
            f"(expected {len(expected)} rows with index running dataset_from_index..dataset_to_index-1 per "
            f"episode, found {len(index)})"
        )


def check_columns(path: Path, names: list[str], wanted: list[str]) -> None:
    """The data file at ``path`` (with columns ``names``) has every ``wanted`` feature column."""
    missing = [k for k in wanted if k not in names]
    if missing:
        raise DatasetError(
            f"{path} has no column {missing[0]!r}, which meta/info.json lists as a feature "
            f"(columns present: {names})"
        )


def only_episodes(table: pa.Table, eps: list[int]) -> pa.Table:
    """The rows of ``table`` whose ``episode_index`` is one of ``eps``."""
    mask = np.isin(table["episode_index"].to_numpy(), np.asarray(eps))
    return table if mask.all() else table.filter(pa.array(mask))


def episode_rows(
    path: Path,
    table: pa.Table,
    numeric: dict[str, dict],
    image_keys: list[str],
    eps: list[int],
    froms: list[int],
    tos: list[int],
) -> tuple[dict[str, np.ndarray], dict[str, tuple[pa.Array, pa.Array | None]]]:
    """The rows of episodes ``eps`` (``table``, read from ``path`` and passed through
    :func:`only_episodes`) as checked numpy columns and (bytes, paths) image columns, in ``index``
    order; they must be exactly each episode's [from, to) index range."""
    columns = {k: _to_numpy(table[k], k, ft, path) for k, ft in numeric.items()}
    image_cols = {k: _image_column(table[k], k, path) for k in image_keys}
    before = columns["index"].copy()
    _check_rows(path, columns, eps, froms, tos)
    if image_cols and not np.array_equal(before, columns["index"]):
        take = pa.array(np.argsort(before, kind="stable"))
        image_cols = {
            k: (b.take(take), None if p is None else p.take(take)) for k, (b, p) in image_cols.items()
        }
    return columns, image_cols


def numeric_features(meta: DatasetMeta) -> dict[str, dict]:
    """The features stored as numbers in the data files (every one but images and videos)."""
    return {k: ft for k, ft in meta.features.items() if ft["dtype"] not in L.VISUAL_DTYPES}


def load_frames(meta: DatasetMeta) -> FrameTable:
    """Read the data files the selected episodes live in and keep only their rows."""
    eps = meta.episodes
    order = np.argsort(eps[L.EP_FROM], kind="stable")  # meta rows in data order
    by_file: dict[Path, list[int]] = {}
    for pos in order.tolist():
        by_file.setdefault(meta.data_file(pos), []).append(pos)
    numeric = numeric_features(meta)
    wanted = list(numeric) + meta.image_keys
    parts: list[dict[str, np.ndarray]] = []
    images: list[dict[str, tuple[pa.Array, pa.Array | None]]] = []
    for path, positions in by_file.items():
        check_columns(path, read_schema(path).names, wanted)
        ep_ids = eps[L.EP_INDEX][positions].tolist()
        table = only_episodes(read_parquet(path, columns=wanted), ep_ids)
        columns, image_cols = episode_rows(
            path,
            table,
            numeric,
            meta.image_keys,
            ep_ids,
            eps[L.EP_FROM][positions].tolist(),
            eps[L.EP_TO][positions].tolist(),
        )
        parts.append(columns)
        images.append(image_cols)
    columns = {k: np.concatenate([p[k] for p in parts]) for k in numeric}
    seq = np.asarray([pos for positions in by_file.values() for pos in positions], dtype=np.int64)
    lengths = eps[L.EP_LENGTH][seq]  # rows are concatenated file by file, so this is their episode order
    ep_pos = np.repeat(seq, lengths)
    ep_start = np.empty(len(seq), dtype=np.int64)
    ep_start[seq] = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    image_bytes = {k: pa.concat_arrays([im[k][0] for im in images]) for k in meta.image_keys}
    image_paths = {
        k: None if any(im[k][1] is None for im in images) else pa.concat_arrays([im[k][1] for im in images])
        for k in meta.image_keys
    }
    return FrameTable(columns, image_bytes, image_paths, ep_pos, ep_start)
