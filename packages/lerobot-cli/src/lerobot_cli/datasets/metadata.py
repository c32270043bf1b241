"""``meta/`` of a LeRobot v3.0 dataset: info.json, stats.json, tasks.parquet and meta/episodes.

Torch-free on purpose: the CLI reads metadata (fps, features, stats) to build the policy config before it
imports torch, and a bad dataset should fail here, with the file named, before any model is built.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import string
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from attrs import define, field
from lerobot_ckpt.paths import UnsafePathError, check_name, resolve_inside

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.errors import DatasetError
from lerobot_cli.errors import ConfigError
from lerobot_cli.features import visual_chw as features_chw

logger = logging.getLogger(__name__)


def dataset_file(root: Path, entry: str, template: str, **fields: Any) -> Path:
    """``root`` / ``template`` filled in, checked to stay inside ``root`` (a dataset is untrusted: its
    ``meta/info.json`` names these paths, and a feature name fills ``{video_key}``).

    The filled path must be relative without ``..``; when it exists it must be a regular file inside
    ``root``, symlinks included (a link to elsewhere on the disk is refused). A missing file is left to
    the reader, which names it. Checked once per distinct file."""
    _check_template(root, entry, template, tuple(fields))
    try:
        relative = template.format(**fields)
    except (KeyError, IndexError, ValueError, AttributeError) as err:
        raise DatasetError(
            f"{root / L.INFO_PATH}: {entry} {template!r} is not a template of "
            f"{{{'}, {'.join(fields)}}} ({type(err).__name__}: {err})"
        ) from None
    return _checked_file(root, entry, relative)


# A field's format spec: an optional zero fill, a width below 100, an optional type d (LeRobot: 03d).
_FORMAT_SPEC = re.compile(r"0?[0-9]{0,2}d?")


@functools.lru_cache(maxsize=256)
def _check_template(root: Path, entry: str, template: str, names: tuple[str, ...]) -> None:
    """A path template may hold only ``{name}`` or ``{name:03d}``-like fields of ``names``: no
    attribute or index access (``{chunk_index.__class__}``), no conversion (``!r``), no nested
    field, no width that would build a huge name."""
    allowed = f"{{{'}, {'.join(names)}}} with an optional format like :03d"

    def refuse(why: str) -> DatasetError:
        return DatasetError(
            f"{root / L.INFO_PATH}: {entry} {template[:200]!r} is not a template of {allowed} ({why})"
        )

    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:
        raise refuse(str(err)) from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in names:
            raise refuse(f"field {{{name[:60]}}} is not one of them")
        if conversion is not None:
            raise refuse(f"field {{{name}!{conversion}}} has a conversion")
        if spec and not _FORMAT_SPEC.fullmatch(spec):
            raise refuse(f"field {{{name}:{spec[:60]}}} has a format other than 0, a width < 100, d")


def meta_file(root: Path, relative: str) -> Path:
    """``root / relative`` for a file of ``meta/`` (a fixed name or a hit of the episodes glob),
    checked like the files ``meta/info.json`` names: a link out of the dataset root is refused
    before a byte is read; a missing file is left to the reader, which names it."""
    return _checked_file(root, "a dataset file", relative, named_by=root)


def image_file(root: Path, relative: str, named_by: Path) -> Path:
    """``root / relative`` for an image whose parquet row (in ``named_by``) gives a path instead of
    bytes, checked like every file the dataset names: relative, no ``..``, no link out of ``root``."""
    return _checked_file(root, "an image path", relative, named_by=named_by)


@functools.lru_cache(maxsize=65536)
def _checked_file(root: Path, entry: str, relative: str, named_by: Path | None = None) -> Path:
    info = root / L.INFO_PATH if named_by is None else named_by
    fix = "use the dataset as LeRobot wrote it (every file under the dataset root, no links out of it)"
    try:
        check_name(relative, named_by=info, entry=entry, fix=fix)
        try:
            os.lstat(root / relative)
        except (FileNotFoundError, NotADirectoryError):
            return root / relative
        except OSError as err:  # a name too long, a loop, no permission: one line, not a traceback
            raise UnsafePathError(
                info, entry, relative, f"names {root / relative}, which cannot be read ({err.strerror})", fix
            ) from None
        return resolve_inside(root, relative, named_by=info, entry=entry, allow_links_within=root, fix=fix)
    except UnsafePathError as err:
        raise DatasetError(str(err)) from None


def _is_file(path: Path) -> bool:
    """``path.is_file()`` with every OS error (a name too long, …) a DatasetError naming it."""
    try:
        return path.is_file()
    except OSError as err:
        raise DatasetError(f"cannot read {str(path)[:300]}: {err.strerror}") from None


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """Memory-mapped parquet read that turns every failure into a DatasetError naming the file."""
    if not _is_file(path):
        raise DatasetError(f"missing file {path}: the dataset layout (meta/info.json) says it must exist")
    try:
        return pq.read_table(path, columns=columns, memory_map=True)
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(f"cannot read parquet file {path}: {err}") from err


def read_schema(path: Path) -> pa.Schema:
    if not _is_file(path):
        raise DatasetError(f"missing file {path}: the dataset layout (meta/info.json) says it must exist")
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(f"cannot read parquet file {path}: {err}") from err


def read_json(path: Path) -> Any:
    if not _is_file(path):
        raise DatasetError(f"missing file {path}: every LeRobot v3.0 dataset has {path.name} under meta/")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(f"{path} is not valid JSON: {err}") from err


def visual_chw(key: str, feature: dict) -> tuple[int, int, int]:
    """(C, H, W) of an image/video feature (:func:`lerobot_cli.features.visual_chw`, LeRobot's rule), a
    shape that is not 3-dim refused as a :class:`DatasetError`: the dataset's file is what to fix."""
    try:
        return features_chw(key, feature)
    except ConfigError as exc:
        raise DatasetError(str(exc)) from None


def _check_info(path: Path, info: Any) -> dict[str, dict]:
    """Validate info.json and return the features this reader can serve (unsupported dtypes dropped)."""
    if not isinstance(info, dict):
        raise DatasetError(f"{path} must hold a JSON object with codebase_version, fps and features")
    version = info.get("codebase_version")
    if version not in L.SUPPORTED_VERSIONS:
        hint = ""
        if isinstance(version, str) and version.startswith("v2"):
            hint = (
                " (convert it with LeRobot: python -m lerobot.datasets.v30.convert_dataset_v21_to_v30"
                " --repo-id=<repo_id>)"
            )
        raise DatasetError(
            f"{path}: codebase_version {version!r} is not supported; supported versions: "
            f"{', '.join(L.SUPPORTED_VERSIONS)}{hint}"
        )
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps <= 0:
        raise DatasetError(f"{path}: fps must be a positive number, got {fps!r}")
    if not isinstance(info.get("data_path"), str):
        raise DatasetError(f"{path}: data_path must be a template like {L.DEFAULT_DATA_PATH!r}")
    raw = info.get("features")
    if not isinstance(raw, dict) or not raw:
        raise DatasetError(f"{path}: features must be a non-empty object of name -> {{dtype, shape, names}}")
    features: dict[str, dict] = {}
    for key, ft in raw.items():
        if not isinstance(ft, dict) or not isinstance(ft.get("dtype"), str):
            raise DatasetError(f"{path}: feature {key!r} needs a string dtype, got {ft!r}")
        shape = ft.get("shape")
        if not isinstance(shape, (list, tuple)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape
        ):
            raise DatasetError(f"{path}: feature {key!r} needs a shape of positive ints, got {shape!r}")
        dtype = ft["dtype"]
        if dtype not in L.NUMERIC_DTYPES and dtype not in L.VISUAL_DTYPES:
            logger.warning("%s: skipping feature %r of unsupported dtype %r", path, key, dtype)
            continue
        features[key] = {**ft, "shape": tuple(shape)}
        if dtype in L.VISUAL_DTYPES:
            visual_chw(key, features[key])
    if any(ft["dtype"] == "video" for ft in features.values()) and not isinstance(
        info.get("video_path"), str
    ):
        raise DatasetError(f"{path}: video features need video_path like {L.DEFAULT_VIDEO_PATH!r}")
    for key, ft in L.DEFAULT_FEATURES.items():
        features.setdefault(key, {**ft, "shape": tuple(ft["shape"])})
    return features


def _load_stats(path: Path) -> dict[str, dict[str, np.ndarray]]:
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise DatasetError(f"{path} must map feature -> {{mean, std, min, max, count}}")
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, per_stat in raw.items():
        if not isinstance(per_stat, dict):
            raise DatasetError(f"{path}: stats of {key!r} must be an object of stat name -> list")
        try:
            stats[key] = {name: np.asarray(value) for name, value in per_stat.items()}
        except ValueError as err:
            raise DatasetError(f"{path}: stats of {key!r} are not rectangular number lists ({err})") from err
        bad = [n for n, v in stats[key].items() if v.dtype.kind not in "biuf"]
        if bad:
            raise DatasetError(f"{path}: stats {bad} of {key!r} must be numbers")
    return stats


def _load_tasks(path: Path) -> dict[int, str]:
    """task_index -> task, whether pandas stored the task strings as its index or as a ``task`` column."""
    table = read_parquet(path)
    if "task_index" not in table.column_names:
        raise DatasetError(f"{path} has no task_index column (columns: {table.column_names})")
    column = "task" if "task" in table.column_names else None
    if column is None:
        meta = table.schema.metadata or {}
        pandas_meta = json.loads(meta.get(b"pandas", b"{}"))
        names = [c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)]
        strings = [
            f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
        ]
        column = next(
            (c for c in names if c in table.column_names), strings[0] if len(strings) == 1 else None
        )
    if column is None:
        raise DatasetError(
            f"{path} must hold task strings (a 'task' column or the pandas index) and task_index"
        )
    indices = table["task_index"].to_pylist()
    return {int(i): str(t) for i, t in zip(indices, table[column].to_pylist(), strict=True)}


def _episode_columns(video_keys: list[str]) -> list[str]:
    cols = [L.EP_INDEX, L.EP_LENGTH, L.EP_FROM, L.EP_TO, L.EP_DATA_CHUNK, L.EP_DATA_FILE]
    for key in video_keys:
        cols += [L.video_column(key, f) for f in ("chunk_index", "file_index", "from_timestamp")]
    return cols


def _load_episodes(root: Path, video_keys: list[str]) -> dict[str, np.ndarray]:
    found = sorted((root / L.EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    paths = [meta_file(root, p.relative_to(root).as_posix()) for p in found]
    if not paths:
        raise DatasetError(
            f"missing files {root / L.EPISODES_DIR}/chunk-XXX/file-XXX.parquet: no episode metadata"
        )
    required = _episode_columns(video_keys)
    parts: list[dict[str, np.ndarray]] = []
    for path in paths:
        names = read_schema(path).names
        missing = [c for c in required if c not in names]
        if missing:
            raise DatasetError(f"{path} lacks episode columns {missing}; LeRobot v3.0 writes {required}")
        columns = [c for c in names if not c.startswith(L.STATS_PREFIX)]
        table = read_parquet(path, columns=columns)
        holes = [c for c in required if table[c].null_count]
        if holes:
            raise DatasetError(
                f"{path} has missing values in episode columns {holes}; every episode needs them"
            )
        part = {c: table[c].to_numpy() for c in required}
        part[L.EP_TASKS] = np.empty(table.num_rows, dtype=object)  # 1-D array of per-episode task lists
        for i, tasks in enumerate(table[L.EP_TASKS].to_pylist() if L.EP_TASKS in names else []):
            part[L.EP_TASKS][i] = tasks
        if np.any(part[L.EP_TO] - part[L.EP_FROM] != part[L.EP_LENGTH]):
            raise DatasetError(
                f"{path}: dataset_to_index - dataset_from_index must equal length for every episode"
            )
        parts.append(part)
    episodes = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    order = np.argsort(episodes[L.EP_INDEX], kind="stable")
    episodes = {c: v[order] for c, v in episodes.items()}
    if len(np.unique(episodes[L.EP_INDEX])) != len(order):
        raise DatasetError(f"{root / L.EPISODES_DIR}: an episode_index appears in more than one row")
    return episodes


class FeatureKeys:
    """The camera keys of ``self.features`` by storage (a dataset's or a mixture's metadata)."""

    __slots__ = ()
    features: dict[str, dict]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] == "image"]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] in L.VISUAL_DTYPES]


class MetaView:
    """What a dataset reader answers from its ``self.meta``: fps, features, stats, episode count."""

    meta: Any

    @property
    def fps(self) -> float:
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict]:
        return self.meta.features

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        return self.meta.stats

    @property
    def num_episodes(self) -> int:
        return self.meta.num_episodes


@define(frozen=True, eq=False)
class DatasetMeta(FeatureKeys):
    """Everything under ``meta/``; ``episodes`` may be a selection (see :meth:`select`).

    ``stats`` are the whole dataset's (as in LeRobot, also when episodes are selected), numpy arrays per
    feature and statistic (``mean``, ``std``, ``min``, ``max``, ``count``, maybe quantiles).
    """

    root: Path
    info: dict
    features: dict[str, dict]
    stats: dict[str, dict[str, np.ndarray]]
    tasks: dict[int, str]
    episodes: dict[str, np.ndarray] = field(repr=False)

    @property
    def fps(self) -> float:
        return self.info["fps"]

    @property
    def episode_indices(self) -> list[int]:
        return self.episodes[L.EP_INDEX].tolist()

    @property
    def num_episodes(self) -> int:
        """Episodes covered by this (possibly selected) metadata."""
        return len(self.episodes[L.EP_INDEX])

    @property
    def num_frames(self) -> int:
        """Frames covered by this (possibly selected) metadata."""
        return int(self.episodes[L.EP_LENGTH].sum())

    @property
    def total_episodes(self) -> int:
        return int(self.info.get("total_episodes", self.num_episodes))

    @property
    def total_frames(self) -> int:
        return int(self.info.get("total_frames", self.num_frames))

    def data_file(self, pos: int) -> Path:
        """Data parquet of the episode at row ``pos`` of :attr:`episodes`."""
        return dataset_file(
            self.root,
            "data_path",
            self.info["data_path"],
            chunk_index=int(self.episodes[L.EP_DATA_CHUNK][pos]),
            file_index=int(self.episodes[L.EP_DATA_FILE][pos]),
        )

    def video_file(self, pos: int, key: str) -> Path:
        return dataset_file(
            self.root,
            "video_path",
            self.info["video_path"],
            video_key=key,
            chunk_index=int(self.episodes[L.video_column(key, "chunk_index")][pos]),
            file_index=int(self.episodes[L.video_column(key, "file_index")][pos]),
        )

    def select(self, episodes: list[int] | tuple[int, ...] | None) -> DatasetMeta:
        """The same metadata restricted to ``episodes`` (dataset order kept); unknown indices fail."""
        if episodes is None:
            return self
        if not len(episodes):
            raise DatasetError(
                f"--dataset.episodes selects no episode of {self.root}: give at least one "
                "episode index, or leave it unset for all episodes"
            )
        have = self.episodes[L.EP_INDEX]
        unknown = sorted(set(episodes) - set(have.tolist()))
        if unknown:
            raise DatasetError(
                f"--dataset.episodes {unknown} not in {self.root / L.EPISODES_DIR} "
                f"(it has {len(have)} episodes, indices {int(have.min())}..{int(have.max())})"
            )
        mask = np.isin(have, np.asarray(list(episodes), dtype=have.dtype))
        return DatasetMeta(
            self.root,
            self.info,
            self.features,
            self.stats,
            self.tasks,
            {c: v[mask] for c, v in self.episodes.items()},
        )


def load_meta(root: str | Path) -> DatasetMeta:
    """Read and validate ``<root>/meta``; every problem is a DatasetError naming the file."""
    root = Path(root)
    info_path = meta_file(root, L.INFO_PATH)
    info = read_json(info_path)
    features = _check_info(info_path, info)
    video_keys = [k for k, ft in features.items() if ft["dtype"] == "video"]
    stats = _load_stats(meta_file(root, L.STATS_PATH))
    tasks = _load_tasks(meta_file(root, L.TASKS_PATH))
    episodes = _load_episodes(root, video_keys)
    return DatasetMeta(root, info, features, stats, tasks, episodes)
