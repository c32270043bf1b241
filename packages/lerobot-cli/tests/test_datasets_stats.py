"""Dataset statistics: the quantiles pi05 normalises with (q01/q99, LeRobot 0.6.1's histogram estimator),
per episode and aggregated, as the writer stores them in meta/episodes and meta/stats.json.

Bit-for-bit agreement with LeRobot's own compute_episode_stats / aggregate_stats is checked by
tools/interop/pi05_lerobot_interop.py (it needs LeRobot's environment); here the estimator is held to
what it promises: within one of its 5,000 bins of the empirical quantile."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from lerobot_cli.datasets.stats import (
    QUANTILE_BINS,
    QUANTILES,
    aggregate_stats,
    episode_stats,
    histogram_quantiles,
)
from lerobot_cli.datasets.writer import EpisodeData, write_dataset

DEMO = Path(__file__).resolve().parents[3] / "data" / "lerobot" / "demo_reach"


def _columns(rng: np.random.Generator, n: int) -> np.ndarray:
    """Skewed, heavy-tailed with outliers, uniform, and discrete columns (many ties)."""
    outliers = np.array([40.0, -55.0, 90.0])[: n // 4]
    heavy = np.concatenate([rng.standard_t(2, n - len(outliers)), outliers])
    return np.stack(
        [rng.exponential(2.0, n), heavy, rng.uniform(-1, 1, n), rng.integers(0, 7, n).astype(float)], axis=1
    ).astype(np.float32)


@pytest.mark.parametrize("n", [2, 3, 17, 1000, 20_000])
def test_quantiles_are_within_one_bin_of_the_empirical_ones(n):
    rows = _columns(np.random.default_rng(n), n)
    got = histogram_quantiles(rows)
    assert list(got) == ["q01", "q10", "q50", "q90", "q99"]
    width = (rows.max(axis=0) - rows.min(axis=0)).astype(np.float64) / QUANTILE_BINS
    for name, q in QUANTILES.items():
        # The first value whose empirical CDF reaches q lies in the bin the estimator interpolates in.
        exact = np.quantile(rows.astype(np.float64), q, axis=0, method="inverted_cdf")
        tolerance = width * (1 + 1e-3) + 1e-6 * np.abs(rows).max(
            axis=0
        )  # bin edges are float32, as LeRobot's
        assert got[name].shape == (4,)
        assert np.all(np.abs(got[name] - exact) <= tolerance), (name, got[name], exact, width)
    assert np.all(np.diff(np.stack(list(got.values())), axis=0) >= 0)  # q01 <= q10 <= ... <= q99


def test_constant_and_integer_columns():
    constant = histogram_quantiles(np.full((10, 2), 0.3, np.float32))
    assert all(np.all(v == np.float32(0.3)) for v in constant.values())
    steps = histogram_quantiles(
        np.array([[0], [1], [1], [2]], np.int64)
    )  # promoted to float64, as LeRobot does
    assert steps["q50"].dtype == np.float64 and abs(steps["q50"][0] - 1.0) < 1e-3


def test_episode_stats_shapes_and_short_episodes():
    rng = np.random.default_rng(0)
    features = {
        "observation.state": {"dtype": "float32"},
        "timestamp": {"dtype": "float32"},
        "observation.images.top": {"dtype": "video"},
    }
    data = {
        "observation.state": rng.normal(size=(50, 3)).astype(np.float32),
        "timestamp": np.arange(50, dtype=np.float32) / 10,
        "observation.images.top": rng.integers(0, 256, (50, 8, 8, 3), dtype=np.uint8),
    }
    stats = episode_stats(data, features)
    assert set(stats["observation.state"]) == {"min", "max", "mean", "std", "count", *QUANTILES}
    assert stats["observation.state"]["q99"].shape == (3,) and stats["timestamp"]["q50"].shape == (1,)
    image = stats["observation.images.top"]
    assert image["q01"].shape == (3, 1, 1) and 0.0 <= image["q01"].min() <= image["q99"].max() <= 1.0
    pixels = np.transpose(data["observation.images.top"], (0, 3, 1, 2)).astype(np.float32)
    assert np.all(
        np.abs(image["q50"].ravel() - np.median(pixels, axis=(0, 2, 3)) / 255) <= 1 / 255 + 255 / 5000 / 255
    )
    one = episode_stats({"observation.state": data["observation.state"][:1]}, features)["observation.state"]
    assert all(np.array_equal(one[name], one["mean"]) for name in QUANTILES)  # LeRobot: fewer than 2 rows


def test_aggregated_quantiles_are_the_count_weighted_mean_of_the_episodes():
    rng = np.random.default_rng(1)
    features = {"action": {"dtype": "float32"}, "observation.images.top": {"dtype": "video"}}
    parts = [
        episode_stats(
            {
                "action": rng.normal(i, 1, (n, 2)).astype(np.float32),
                "observation.images.top": rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8),
            },
            features,
        )
        for i, n in enumerate((10, 30, 5))
    ]
    total = aggregate_stats(parts)
    for key in features:
        for name in QUANTILES:
            expected = sum(p[key][name] * p[key]["count"][0] for p in parts) / 45
            np.testing.assert_allclose(total[key][name], expected, rtol=1e-12)
            assert total[key][name].shape == parts[0][key][name].shape
    del parts[1]["action"]["q50"]  # an episode without a quantile: the dataset gets none (LeRobot's rule)
    assert "q50" not in aggregate_stats(parts)["action"] and "q01" in aggregate_stats(parts)["action"]


def test_writer_stores_quantiles_per_episode_and_for_the_dataset(tmp_path):
    rng = np.random.default_rng(2)
    features = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
    }
    episodes = [
        EpisodeData("reach", {k: rng.normal(size=(n, 2)).astype(np.float32) for k in features})
        for n in (12, 20)
    ]
    root = write_dataset(tmp_path / "ds", 10, features, episodes)
    stats = json.loads((root / "meta" / "stats.json").read_text())
    table = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    for key in ("observation.state", "action", "index"):
        for name in QUANTILES:
            per_episode = np.array(table[f"stats/{key}/{name}"])
            counts = np.array(table[f"stats/{key}/count"])
            np.testing.assert_allclose(
                stats[key][name], (per_episode * counts).sum(axis=0) / counts.sum(), rtol=1e-12
            )
    from lerobot_cli.datasets import load_meta
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies.pi05.config import PI05Config
    from lerobot_cli.processors.factory import make_pre_post_processors

    config = PI05Config(
        input_features={
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 56, 56)),
            "observation.state": PolicyFeature(FeatureType.STATE, (2,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (2,))},
    )
    make_pre_post_processors(config, load_meta(root).stats)  # QUANTILES find q01/q99: no MissingStatsError


def test_missing_quantiles_name_fixes_that_work():
    """pi05's QUANTILES on statistics without quantiles (datasets written before them, such as the shipped
    demo): the error names the mapping the statistics support and where q01-q99 come from."""
    from lerobot_cli.datasets import load_meta
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies.pi05.config import PI05Config
    from lerobot_cli.processors.factory import MissingStatsError, make_pre_post_processors

    features = {
        "input_features": {
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 56, 56)),
            "observation.state": PolicyFeature(FeatureType.STATE, (2,)),
        },
        "output_features": {"action": PolicyFeature(FeatureType.ACTION, (2,))},
    }
    stats = {
        k: {s: v for s, v in per.items() if not s.startswith("q")} for k, per in load_meta(DEMO).stats.items()
    }
    with pytest.raises(MissingStatsError) as info:
        make_pre_post_processors(PI05Config(**features), stats)
    supported = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    assert info.value.supported_mapping == supported
    assert f"--policy.normalization_mapping='{json.dumps(supported)}'" in str(info.value)
    assert "tools/make_demo_dataset.py" in str(info.value) and "recompute_stats" in str(info.value)
    del stats["action"]["mean"]
    with pytest.raises(MissingStatsError) as info:
        make_pre_post_processors(PI05Config(**features), stats)
    assert info.value.supported_mapping["ACTION"] == "MIN_MAX"
    import attrs

    config = attrs.evolve(PI05Config(**features), normalization_mapping=info.value.supported_mapping)
    make_pre_post_processors(config, stats)  # the named mapping works on these statistics
