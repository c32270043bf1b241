"""Per-episode and aggregated feature statistics, computed the way LeRobot computes them.

The numbers end up in ``meta/episodes`` (``stats/<key>/<stat>``) and ``meta/stats.json`` and from there in
the normalization processors, so they must match LeRobot's definitions: per-dimension min/max/mean/std
over frames, cameras per channel in [0, 1] with shape (C, 1, 1) from a sample of frames, and ``count``.

Quantiles ``q01``, ``q10``, ``q50``, ``q90``, ``q99`` (pi05 normalises states and actions with q01/q99) use
LeRobot 0.6.1's estimator (``compute_stats.RunningQuantileStats`` after one update, which is what its
``get_feature_stats`` does per episode): per dimension a 5,000-bin histogram between the minimum and the
maximum, the quantile read off its cumulative counts with linear interpolation inside the bin. It is
within one bin, ``(max - min) / 5000``, of the empirical distribution's quantile. Episodes of fewer than
two rows take the mean, and the dataset's quantiles are the episodes' averaged with their counts as
weights (LeRobot's ``aggregate_feature_stats``; not the pooled data's quantiles).
"""

from __future__ import annotations

import numpy as np

from lerobot_cli.datasets import layout as L


def sample_indices(
    length: int, min_samples: int = 100, max_samples: int = 10_000, power: float = 0.75
) -> np.ndarray:
    """Evenly spread frame indices, as many as LeRobot samples for image stats of an episode this long."""
    low = min(min_samples, length)
    count = max(low, min(int(length**power), max_samples))
    return np.round(np.linspace(0, length - 1, count)).astype(int)


# LeRobot's DEFAULT_QUANTILES under its key names (f"q{int(q * 100):02d}")
QUANTILES: dict[str, float] = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
QUANTILE_BINS = 5000


def _histogram_quantile(hist: np.ndarray, edges: np.ndarray, target: float) -> float:
    cumsum = np.cumsum(hist)
    idx = int(np.searchsorted(cumsum, target))
    if idx == 0:
        return edges[0]
    if idx >= len(cumsum):
        return edges[-1]
    before = cumsum[idx - 1]
    inside = cumsum[idx] - before
    if inside == 0:
        return edges[idx]
    return edges[idx] + (target - before) / inside * (edges[idx + 1] - edges[idx])


def histogram_quantiles(rows: np.ndarray) -> dict[str, np.ndarray]:
    """``QUANTILES`` of each column of ``rows`` (N >= 2, D), estimated as LeRobot 0.6.1 does
    (see module doc)."""
    rows = rows.astype(np.result_type(rows.dtype, np.float32), copy=False)
    low, high = np.min(rows, axis=0), np.max(rows, axis=0)
    columns = []
    for i in range(rows.shape[1]):
        # low[i] - 1e-10 stays in the data's float type (a Python float is weak under NumPy 2): as LeRobot's
        edges = np.linspace(low[i] - 1e-10, high[i] + 1e-10, QUANTILE_BINS + 1)
        hist = np.zeros(QUANTILE_BINS) + np.histogram(rows[:, i], bins=edges)[0]
        columns.append((hist, edges))
    return {
        name: np.array([_histogram_quantile(hist, edges, q * len(rows)) for hist, edges in columns])
        for name, q in QUANTILES.items()
    }


def _feature_stats(array: np.ndarray, axis: int | tuple[int, ...], keepdims: bool) -> dict[str, np.ndarray]:
    stats = {
        "min": np.min(array, axis=axis, keepdims=keepdims),
        "max": np.max(array, axis=axis, keepdims=keepdims),
        "mean": np.mean(array, axis=axis, keepdims=keepdims),
        "std": np.std(array, axis=axis, keepdims=keepdims),
        "count": np.array([len(array)]),
    }
    if axis == (0, 2, 3):  # cameras (N, C, H, W): every pixel of the sampled frames is a row
        rows = np.transpose(array, (0, 2, 3, 1)).reshape(-1, array.shape[1])
    else:
        rows = array.reshape(len(array), -1)
    if len(rows) < 2:
        quantiles = {name: stats["mean"].copy() for name in QUANTILES}
    else:
        quantiles = {name: q.reshape(stats["mean"].shape) for name, q in histogram_quantiles(rows).items()}
    return {**stats, **quantiles}


def episode_stats(data: dict[str, np.ndarray], features: dict[str, dict]) -> dict[str, dict[str, np.ndarray]]:
    """Stats of one episode; ``data`` maps key -> (T, ...) arrays, cameras as uint8 (T, H, W, C)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, array in data.items():
        if features[key]["dtype"] in L.VISUAL_DTYPES:
            sampled = np.transpose(array[sample_indices(len(array))], (0, 3, 1, 2))
            stats = _feature_stats(sampled, axis=(0, 2, 3), keepdims=True)
            out[key] = {k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in stats.items()}
        else:
            out[key] = _feature_stats(array, axis=0, keepdims=array.ndim == 1)
    return out


def aggregate_stats(stats_list: list[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    """Dataset stats from episode stats: count-weighted mean, pooled variance, global min/max."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for key in dict.fromkeys(k for stats in stats_list for k in stats):
        parts = [s[key] for s in stats_list if key in s]
        means = np.stack([p["mean"] for p in parts])
        variances = np.stack([p["std"] ** 2 for p in parts])
        counts = np.stack([p["count"] for p in parts])
        total = counts.sum(axis=0)
        while counts.ndim < means.ndim:
            counts = np.expand_dims(counts, axis=-1)
        mean = (means * counts).sum(axis=0) / total
        variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
        out[key] = {
            "min": np.min(np.stack([p["min"] for p in parts]), axis=0),
            "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
            "mean": mean,
            "std": np.sqrt(variance),
            "count": total,
        }
        for name in QUANTILES:  # count-weighted mean of the episodes' quantiles, when every episode has them
            if all(name in p for p in parts):
                out[key][name] = (np.stack([p[name] for p in parts]) * counts).sum(axis=0) / total
    return out


def to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, list]]:
    return {key: {name: np.asarray(v).tolist() for name, v in per.items()} for key, per in stats.items()}
