"""Data-parallel training loop pieces: sharded resumable sampler, step loop, metric reduction.

Names load lazily so that importing the package (e.g. for a version check) does not import torch.
"""

__version__ = "0.1.0"

_LAZY = {
    "ShardedBatchSampler": "lerobot_trainloop.sampler",
    "epoch_permutation": "lerobot_trainloop.sampler",
    "TrainLoop": "lerobot_trainloop.loop",
    "StepOutput": "lerobot_trainloop.loop",
    "NonFiniteLossError": "lerobot_trainloop.loop",
    "DEFAULT_REDUCTIONS": "lerobot_trainloop.loop",
    "StepEvent": "lerobot_trainloop.loop",
    "MetricsTracker": "lerobot_trainloop.metrics",
    "Meter": "lerobot_trainloop.metrics",
    "move_to_device": "lerobot_trainloop.batch",
    "batch_size_of": "lerobot_trainloop.batch",
    # the effective-batch arithmetic lives with the topology; re-exported for loop users
    "effective_batch_size": "lerobot_parallel.batching",
    "effective_batch_line": "lerobot_parallel.batching",
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
