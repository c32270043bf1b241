"""Data-parallel training loop pieces: sharded resumable sampler, data source, step loop, EMA, metric
reduction, and DataLoader workers that survive a launcher's stop signal (``ShieldedDataLoader``).

Importing the package does not import torch (a CLI builds and validates its config tree, ``EmaConfig``
included, before torch loads): the configs and batch arithmetic are eager, every torch-using name
loads on first attribute access. A version check reads package metadata
(``importlib.metadata.version("lerobot-trainloop")``) without importing the package.
"""

from typing import TYPE_CHECKING

from lerobot_parallel.batching import effective_batch_line, effective_batch_size

from lerobot_trainloop.config import EmaConfig

__version__ = "0.1.0"

if TYPE_CHECKING:  # the lazy names as real imports, for readers and type checkers (never run)
    from lerobot_trainloop.batch import batch_size_of, move_to_device
    from lerobot_trainloop.data_source import DataSource, MapDataSource
    from lerobot_trainloop.ema import ModelEma
    from lerobot_trainloop.episode_stream import EpisodeStream
    from lerobot_trainloop.loader import resumable_loader
    from lerobot_trainloop.loop import (
        DEFAULT_REDUCTIONS,
        NonFiniteLossError,
        StepEvent,
        StepOutput,
        TrainLoop,
    )
    from lerobot_trainloop.metrics import Meter, MetricsTracker
    from lerobot_trainloop.mixture import MixtureBatchSampler
    from lerobot_trainloop.sampler import ShardedBatchSampler, SubsetBatches, epoch_permutation
    from lerobot_trainloop.streaming import StreamingDataSource, merge_states
    from lerobot_trainloop.worker_signals import ShieldedDataLoader

_LAZY = {
    "batch_size_of": "lerobot_trainloop.batch",
    "move_to_device": "lerobot_trainloop.batch",
    "DataSource": "lerobot_trainloop.data_source",
    "MapDataSource": "lerobot_trainloop.data_source",
    "ModelEma": "lerobot_trainloop.ema",
    "resumable_loader": "lerobot_trainloop.loader",
    "DEFAULT_REDUCTIONS": "lerobot_trainloop.loop",
    "NonFiniteLossError": "lerobot_trainloop.loop",
    "StepEvent": "lerobot_trainloop.loop",
    "StepOutput": "lerobot_trainloop.loop",
    "TrainLoop": "lerobot_trainloop.loop",
    "Meter": "lerobot_trainloop.metrics",
    "MetricsTracker": "lerobot_trainloop.metrics",
    "MixtureBatchSampler": "lerobot_trainloop.mixture",
    "ShardedBatchSampler": "lerobot_trainloop.sampler",
    "SubsetBatches": "lerobot_trainloop.sampler",
    "epoch_permutation": "lerobot_trainloop.sampler",
    "EpisodeStream": "lerobot_trainloop.episode_stream",
    "StreamingDataSource": "lerobot_trainloop.streaming",
    "merge_states": "lerobot_trainloop.streaming",
    "ShieldedDataLoader": "lerobot_trainloop.worker_signals",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lerobot_trainloop' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DEFAULT_REDUCTIONS",
    "DataSource",
    "EmaConfig",
    "EpisodeStream",
    "MapDataSource",
    "Meter",
    "MetricsTracker",
    "MixtureBatchSampler",
    "ModelEma",
    "NonFiniteLossError",
    "ShardedBatchSampler",
    "ShieldedDataLoader",
    "StepEvent",
    "StepOutput",
    "StreamingDataSource",
    "SubsetBatches",
    "TrainLoop",
    "batch_size_of",
    "effective_batch_line",
    "effective_batch_size",
    "epoch_permutation",
    "merge_states",
    "move_to_device",
    "resumable_loader",
]
