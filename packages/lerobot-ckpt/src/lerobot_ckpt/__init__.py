"""Checkpoint layout, formats and conversion for LeRobot training runs (no accelerate, no CLI).

``import lerobot_ckpt`` stays torch-free (a CLI resolves paths and reads records before paying
for torch); the torch-using API below is imported on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

from lerobot_ckpt.discovery import latest_checkpoint, list_checkpoints, resolve_checkpoint_dir, resolve_last
from lerobot_ckpt.errors import (
    CheckpointConfigError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointSaveError,
    CheckpointWriteError,
    CorruptCheckpointError,
    InsufficientDiskSpaceError,
    LegacyCheckpointError,
    MissingCheckpointFileError,
    ModelMismatchError,
    OptimizerMismatchError,
    OutputExistsError,
    StateMismatchError,
    UnsupportedCheckpointError,
)
from lerobot_ckpt.formats import CheckpointFormat
from lerobot_ckpt.layout import CheckpointPaths, checkpoints_dir, step_dir_name
from lerobot_ckpt.pretrained import pretrained_weights_file
from lerobot_ckpt.record import (
    Artifacts,
    BaseModel,
    Parallelism,
    RunInfo,
    TrainingStepRecord,
    package_versions,
    read_training_step,
)

__version__ = "0.1.0"

_LAZY = {
    "save_checkpoint": "lerobot_ckpt.save",
    "load_checkpoint": "lerobot_ckpt.load",
    "ResumeState": "lerobot_ckpt.load",
    "unwrap_model": "lerobot_ckpt.model_state",
    "convert_dcp": "lerobot_ckpt.convert",
    "ConvertResult": "lerobot_ckpt.convert",
}

__all__ = [
    "Artifacts",
    "BaseModel",
    "CheckpointConfigError",
    "CheckpointError",
    "CheckpointFormat",
    "CheckpointNotFoundError",
    "CheckpointPaths",
    "CheckpointSaveError",
    "CheckpointWriteError",
    "ConvertResult",
    "CorruptCheckpointError",
    "InsufficientDiskSpaceError",
    "LegacyCheckpointError",
    "MissingCheckpointFileError",
    "ModelMismatchError",
    "OptimizerMismatchError",
    "OutputExistsError",
    "Parallelism",
    "ResumeState",
    "RunInfo",
    "StateMismatchError",
    "TrainingStepRecord",
    "UnsupportedCheckpointError",
    "checkpoints_dir",
    "convert_dcp",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "package_versions",
    "pretrained_weights_file",
    "read_training_step",
    "resolve_checkpoint_dir",
    "resolve_last",
    "save_checkpoint",
    "step_dir_name",
    "unwrap_model",
]

def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lerobot_ckpt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
