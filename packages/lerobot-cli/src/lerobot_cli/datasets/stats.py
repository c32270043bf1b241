"""Per-episode and aggregated feature statistics, computed the way LeRobot computes them.

The numbers end up in ``meta/episodes`` (``stats/<key>/<stat>``) and ``meta/stats.json`` and from there in
the normalization processors, so they must match LeRobot's definitions: per-dimension min/max/mean/std
over frames, cameras per channel in [0, 1] with shape (C, 1, 1) from a sample of frames, and ``count``.
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


def _feature_stats(array: np.ndarray, axis: int | tuple[int, ...], keepdims: bool) -> dict[str, np.ndarray]:
    return {
        "min": np.min(array, axis=axis, keepdims=keepdims),
        "max": np.max(array, axis=axis, keepdims=keepdims),
        "mean": np.mean(array, axis=axis, keepdims=keepdims),
        "std": np.std(array, axis=axis, keepdims=keepdims),
        "count": np.array([len(array)]),
    }


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
    return out


def to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, list]]:
    return {key: {name: np.asarray(v).tolist() for name, v in per.items()} for key, per in stats.items()}
