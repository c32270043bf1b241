"""LeRobot v3.0 datasets: reader, metadata, policy features, and a writer for small simulated datasets.

Names are resolved lazily so that ``import lerobot_cli.datasets.config`` (the CLI's config tree) stays
torch-free; only touching ``LeRobotDataset`` / ``make_dataset`` imports torch.

    root = resolve_dataset_root(DatasetConfig(repo_id="lerobot/demo_reach"))
    ds = LeRobotDataset(root, episodes=[0, 3], delta_timestamps={"action": [i / ds_fps for i in range(10)]})
    features = dataset_to_policy_features(ds.meta.features)   # key -> PolicyFeature(type, shape)
    ds.meta.stats["action"]["mean"]                            # numpy, for the normalization processors
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lazy names as real imports, for readers and type checkers (never run)
    from lerobot_cli.datasets.config import DatasetConfig
    from lerobot_cli.datasets.dataset import LeRobotDataset, make_dataset
    from lerobot_cli.datasets.errors import DatasetError
    from lerobot_cli.datasets.features import (
        dataset_to_policy_features,
        resolve_delta_timestamps,
        split_policy_features,
    )
    from lerobot_cli.datasets.hub import lerobot_home, resolve_dataset_root
    from lerobot_cli.datasets.metadata import DatasetMeta, load_meta
    from lerobot_cli.datasets.writer import EpisodeData, FileLimits, write_dataset

_EXPORTS = {
    "DatasetConfig": "config",
    "DatasetError": "errors",
    "DatasetMeta": "metadata",
    "load_meta": "metadata",
    "resolve_dataset_root": "hub",
    "lerobot_home": "hub",
    "dataset_to_policy_features": "features",
    "split_policy_features": "features",
    "resolve_delta_timestamps": "features",
    "LeRobotDataset": "dataset",
    "make_dataset": "dataset",
    "write_dataset": "writer",
    "EpisodeData": "writer",
    "FileLimits": "writer",
}

__all__ = [
    "DatasetConfig",
    "DatasetError",
    "DatasetMeta",
    "EpisodeData",
    "FileLimits",
    "LeRobotDataset",
    "dataset_to_policy_features",
    "lerobot_home",
    "load_meta",
    "make_dataset",
    "resolve_dataset_root",
    "resolve_delta_timestamps",
    "split_policy_features",
    "write_dataset",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
