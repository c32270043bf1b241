"""Data-parallel training loop pieces: sharded resumable sampler, step loop, metric reduction.

Plain imports: every piece needs torch anyway, and a version check reads package metadata
(``importlib.metadata.version("lerobot-trainloop")``) without importing the package.
"""

from lerobot_parallel.batching import effective_batch_line, effective_batch_size

from lerobot_trainloop.batch import batch_size_of, move_to_device
from lerobot_trainloop.loop import DEFAULT_REDUCTIONS, NonFiniteLossError, StepEvent, StepOutput, TrainLoop
from lerobot_trainloop.metrics import Meter, MetricsTracker
from lerobot_trainloop.sampler import ShardedBatchSampler, epoch_permutation

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_REDUCTIONS",
    "Meter",
    "MetricsTracker",
    "NonFiniteLossError",
    "ShardedBatchSampler",
    "StepEvent",
    "StepOutput",
    "TrainLoop",
    "batch_size_of",
    "effective_batch_line",
    "effective_batch_size",
    "epoch_permutation",
    "move_to_device",
]
