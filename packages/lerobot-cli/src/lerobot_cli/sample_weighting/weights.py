"""LeRobot 0.6.1's sample weighters (``lerobot.utils.sample_weighting``, ``lerobot.rewards.sarm.rabc``),
their formulas in their precision, without pandas.

RA-BC (``RABCWeights``): a frame's progress delta is ``progress[t + chunk_size] - progress[t]`` (the
episode's last frame where ``t + chunk_size`` passes its end; from the progress parquet's
``progress_<head_mode>`` column, in float64 as LeRobot reads it). The deltas of every frame that has one
give the global ``delta_mean = max(mean, 0)`` and ``delta_std = max(std, epsilon)`` (numpy, in the file's
row order, so the float64 sums are LeRobot's). A batch's weights, in float32: 1 where the delta is above
``kappa``, ``clip((delta - (mean - 2 std)) / (4 std + epsilon), 0, 1)`` where it is in ``[0, kappa]``, 0
where negative, and ``fallback_weight`` (1.0) where the frame has no delta (no progress value: LeRobot's
own ``compute_rabc_weights`` writes NaN for frames it could not score); then scaled to sum to the batch
size: ``w * B / (w.sum() + epsilon)``. Frames are found by the batch's ``index``, the dataset's global frame
index.

The file is not trusted: one that is not parquet, lacks a column, has null, duplicate or non-integer
indices, infinite progress, or frames outside the dataset stops the run in one line naming the flag and
the file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lerobot_cli.errors import ConfigError
from lerobot_cli.sample_weighting.config import SampleWeightingConfig

log = logging.getLogger(__name__)

PROGRESS_FILE = "sarm_progress.parquet"
HF_DATASETS = "hf://datasets/"
FLAG = "--sample_weighting.progress_path"


def progress_location(cfg: SampleWeightingConfig, dataset_root: str | None, repo_id: str | None) -> str:
    """The progress file as LeRobot's ``make_sample_weighter`` finds it: the flag, else
    ``<--dataset.root>/sarm_progress.parquet``, else ``hf://datasets/<repo_id>/sarm_progress.parquet``."""
    if cfg.progress_path is not None:
        return cfg.progress_path
    if dataset_root and "://" in dataset_root:  # a streamed dataset's URL
        return f"{dataset_root.rstrip('/')}/{PROGRESS_FILE}"
    if dataset_root:
        return str(Path(dataset_root) / PROGRESS_FILE)
    if repo_id:
        return f"{HF_DATASETS}{repo_id}/{PROGRESS_FILE}"
    raise ConfigError(f"{FLAG}: no progress file: pass {FLAG}=FILE (or --dataset.root)")


def resolve_progress_path(location: str) -> Path:
    """A local path as given (relative to the working directory, as LeRobot's ``Path(path)``), or an
    ``hf://datasets/<owner>/<name>/<file>`` one through huggingface_hub's cache (``HF_HUB_OFFLINE=1``: the
    cache alone), as LeRobot's ``resolve_hf_path``."""
    if not location.startswith(HF_DATASETS):
        if "://" in location:
            raise ConfigError(
                f"{FLAG}={location}: only a local file or hf://datasets/<owner>/<name>/<file> is read (as "
                "LeRobot); copy it to a local path"
            )
        return Path(location)
    parts = location[len(HF_DATASETS) :].split("/")
    if len(parts) < 3 or not all(parts):
        raise ConfigError(f"{FLAG}={location}: expected hf://datasets/<owner>/<name>/<file in the repo>")
    from huggingface_hub import hf_hub_download

    try:
        return Path(
            hf_hub_download(repo_id="/".join(parts[:2]), filename="/".join(parts[2:]), repo_type="dataset")
        )
    except Exception as exc:  # noqa: BLE001 (offline, missing repo or file, auth: all one line)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        why = f"{type(exc).__name__}: {first}"
        raise ConfigError(f"{FLAG}={location}: could not download it ({why})") from None


def _integers(table, name: str, where: str) -> np.ndarray:
    import pyarrow as pa

    column = table.column(name)
    if not pa.types.is_integer(column.type):
        raise ConfigError(f"{where}: column {name!r} must hold integers, not {column.type}")
    if column.null_count:
        raise ConfigError(f"{where}: column {name!r} has {column.null_count} empty values")
    return column.to_numpy().astype(np.int64)


def read_progress(
    path: Path, column: str, *, num_frames: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(index, episode_index, progress)`` of the file's rows, in its order (int64, int64, float64; a
    missing progress value is NaN). ``num_frames``: the dataset's, every index must be below it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = f"{FLAG} {path}"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file (write it with LeRobot's compute_rabc_weights)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ConfigError(f"{where}: not a readable parquet file ({type(exc).__name__}: {exc})") from None
    names = table.column_names
    if column not in names:
        available = [c for c in names if c.startswith("progress")]
        raise ConfigError(
            f"{where}: column {column!r} not found (--sample_weighting.head_mode picks "
            f"progress_<head_mode>). Available progress columns: {available}"
        )
    for needed in ("index", "episode_index"):
        if needed not in names:
            raise ConfigError(f"{where}: column {needed!r} not found (columns: {names})")
    index = _integers(table, "index", where)
    episode = _integers(table, "episode_index", where)
    values = table.column(column)
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise ConfigError(f"{where}: column {column!r} must hold numbers, not {values.type}")
    # float64, as LeRobot's pandas rows hold them; a null is pandas' NaN
    progress = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
    progress = np.where(np.asarray(values.is_null().to_numpy(zero_copy_only=False)), np.nan, progress)
    if np.isinf(progress).any():
        raise ConfigError(f"{where}: column {column!r} has infinite values")
    if len(index) == 0:
        raise ConfigError(f"{where}: the file has no rows")
    unique, counts = np.unique(index, return_counts=True)
    if (counts > 1).any():
        raise ConfigError(f"{where}: frame index {int(unique[counts > 1][0])} appears more than once")
    bad = (index < 0) | (num_frames is not None and index >= num_frames) | (episode < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        size = f" (the dataset has frames 0..{num_frames - 1})" if num_frames is not None else ""
        raise ConfigError(
            f"{where}: row {i} names frame {int(index[i])} of episode {int(episode[i])}, outside the "
            f"dataset{size}: is it this dataset's progress file?"
        )
    return index, episode, progress


class UniformWeighter:
    """LeRobot's ``UniformWeighter``: every weight 1."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def compute_batch_weights(self, batch: dict) -> tuple[torch.Tensor, dict[str, Any]]:
        for key in ("action", "index", "observation.state"):
            if isinstance(batch.get(key), torch.Tensor):
                size = batch[key].shape[0]
                break
        else:
            size = next((v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.ndim), 1)
        return torch.ones(size, device=self.device), {"mean_weight": 1.0, "type": "uniform"}

    def get_stats(self) -> dict[str, Any]:
        return {"type": "uniform"}

    def describe(self) -> str:
        return "uniform (every weight 1)"


class RABCWeights:
    """LeRobot's ``RABCWeights`` on ``(index, episode_index, progress)`` rows (see the module docstring)."""

    def __init__(
        self,
        index: np.ndarray,
        episode: np.ndarray,
        progress: np.ndarray,
        *,
        chunk_size: int,
        head_mode: str = "sparse",
        kappa: float = 0.01,
        epsilon: float = 1e-6,
        fallback_weight: float = 1.0,
        device: torch.device | None = None,
        source: str = "",
    ) -> None:
        self.chunk_size, self.head_mode = int(chunk_size), head_mode
        self.kappa, self.epsilon, self.fallback_weight = float(kappa), float(epsilon), float(fallback_weight)
        self.device = device or torch.device("cpu")
        self.source = source
        valid = ~np.isnan(progress)
        # each episode's end: one past its largest index among all its rows (NaN progress included)
        episodes, where = np.unique(episode, return_inverse=True)
        ends = np.full(len(episodes), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(ends, where, index)
        end = ends[where] + 1
        future = index + self.chunk_size
        future = np.where(future >= end, end - 1, future)
        # the future frame's progress, NaN when that frame has none in the file
        order = np.argsort(index, kind="stable")
        known, known_progress = index[order], progress[order]
        pos = np.minimum(np.searchsorted(known, future), len(known) - 1)
        future_progress = np.where(known[pos] == future, known_progress[pos], np.nan)
        delta = future_progress - progress  # NaN without a current or a future value
        has_delta = valid & ~np.isnan(future_progress)
        # LeRobot's global stats: every delta, in the file's row order
        deltas = delta[has_delta]
        if len(deltas):
            self.delta_mean = max(float(np.mean(deltas)), 0.0)
            self.delta_std = max(float(np.std(deltas)), self.epsilon)
        else:
            self.delta_mean, self.delta_std = 0.0, self.epsilon
            log.warning("RA-BC: no frame of %s has a progress delta; every weight is the fallback", source)
        self.num_frames = int(valid.sum())
        self._index, self._delta = known, delta[order]

    def deltas(self, indices) -> np.ndarray:
        """The progress delta of each global frame index (float64; NaN where there is none)."""
        q = np.asarray(indices, dtype=np.int64).reshape(-1)
        pos = np.minimum(np.searchsorted(self._index, q), len(self._index) - 1)
        return np.where(self._index[pos] == q, self._delta[pos], np.nan)

    def weights_of(self, deltas: np.ndarray) -> np.ndarray:
        """LeRobot's ``_compute_weights`` (paper Eq. 8-9), float32 as there."""
        deltas = np.asarray(deltas, dtype=np.float32)
        valid_mask = ~np.isnan(deltas)
        lower_bound = self.delta_mean - 2 * self.delta_std
        soft_weights = (deltas - lower_bound) / (4 * self.delta_std + self.epsilon)
        soft_weights = np.clip(soft_weights, 0.0, 1.0)
        weights = np.zeros_like(deltas, dtype=np.float32)
        weights[deltas > self.kappa] = 1.0
        moderate_mask = (deltas >= 0) & (deltas <= self.kappa)
        weights[moderate_mask] = soft_weights[moderate_mask]
        weights[~valid_mask] = self.fallback_weight
        return weights

    def compute_batch_weights(self, batch: dict) -> tuple[torch.Tensor, dict[str, Any]]:
        """The batch's weights ``(B,)`` on the device, summing to ``B``, and LeRobot's per-batch stats."""
        indices = batch.get("index")
        if indices is None:
            raise ConfigError("--sample_weighting: the batch has no 'index' (the global frame index)")
        if isinstance(indices, torch.Tensor):
            indices = indices.cpu().numpy()  # a host value here: no device sync
        weights = self.weights_of(self.deltas(indices))
        stats = {
            "mean_weight": float(np.nanmean(weights)),
            "num_zero_weight": int(np.sum(weights == 0)),
            "num_full_weight": int(np.sum(weights == 1.0)),
        }
        w = torch.tensor(weights, dtype=torch.float32).to(self.device, non_blocking=True)
        return w * len(w) / (w.sum() + self.epsilon), stats

    def get_stats(self) -> dict[str, Any]:
        return {
            "type": "rabc",
            "num_frames": self.num_frames,
            "chunk_size": self.chunk_size,
            "head_mode": self.head_mode,
            "delta_mean": self.delta_mean,
            "delta_std": self.delta_std,
            "kappa": self.kappa,
        }

    def describe(self) -> str:
        return (
            f"rabc from {self.source}: {self.num_frames} frames with progress_{self.head_mode}, "
            f"chunk_size {self.chunk_size}, delta mean {self.delta_mean:.4g} std {self.delta_std:.4g}, "
            f"kappa {self.kappa:g}"
        )


def make_sample_weighter(
    cfg: SampleWeightingConfig,
    *,
    chunk_size: int | None,
    device: torch.device,
    path: Path | None = None,
    num_frames: int | None = None,
) -> RABCWeights | UniformWeighter:
    """LeRobot's ``make_sample_weighter``; ``path``: the resolved progress file (rabc)."""
    if cfg.type == "uniform":
        return UniformWeighter(device)
    if chunk_size is None:
        raise ConfigError("--sample_weighting.type=rabc needs a policy with a chunk_size")
    index, episode, progress = read_progress(path, f"progress_{cfg.head_mode}", num_frames=num_frames)
    return RABCWeights(
        index,
        episode,
        progress,
        chunk_size=chunk_size,
        head_mode=cfg.head_mode,
        kappa=cfg.kappa,
        epsilon=cfg.epsilon,
        device=device,
        source=str(path),
        **cfg.extra_params,
    )


def sample_weighter_for_run(cfg, runtime, chunk_size: int | None, total_frames: int | None):
    """The run's weighter: its progress file found as LeRobot does, an ``hf://`` one downloaded once per
    machine (the local main rank first), then read by every rank."""
    from lerobot_cli.fetching import local_main_first

    sw = cfg.sample_weighting
    path = None
    if sw.type == "rabc":
        location = progress_location(sw, cfg.dataset.root, cfg.dataset.repo_id)
        path = local_main_first(runtime, "the progress file", lambda: resolve_progress_path(location))
    return make_sample_weighter(
        sw, chunk_size=chunk_size, device=runtime.device, path=path, num_frames=total_frames
    )
