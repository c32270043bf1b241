"""Checkpoint layout, formats and conversion for LeRobot training runs (no accelerate, no CLI).

This namespace is the package's API; the modules behind it are laid out by concept (see the
README's "Layout"): ``layout``/``discovery``/``pretrained`` name and find checkpoints, ``save``/
``load`` are the transactions over ``objects`` (the training objects both take), ``commit/`` the
crash-safe file-system work, ``state/`` each kind of training state, ``safetensors/`` and ``dcp/``
the two file formats, ``convert/`` the offline merger.

``import lerobot_ckpt`` stays torch-free (a CLI resolves paths, reads records and takes the run
lock before paying for torch), so the torch-using names in ``_LAZY`` are imported on first
attribute access; the ``TYPE_CHECKING`` block names the same imports for readers and type checkers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lerobot_ckpt._torch import INSTALL, torch_missing
from lerobot_ckpt._version import __version__ as __version__  # a leaf: state.record reads it too
from lerobot_ckpt.commit.filesystem import fsync_dir, remove_quietly
from lerobot_ckpt.commit.run_lock import LockHolder, RunDirectoryError, RunDirectoryLockedError, RunLock
from lerobot_ckpt.commit.set_aside import set_aside
from lerobot_ckpt.convert.hub import push_to_hub
from lerobot_ckpt.discovery import (
    latest_checkpoint,
    list_checkpoints,
    newer_checkpoints,
    read_last,
    resolve_checkpoint_dir,
    resolve_last,
    transient_leftovers,
)
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
    UnsafeCheckpointError,
    UnsupportedCheckpointError,
)
from lerobot_ckpt.layout import CheckpointPaths, checkpoints_dir, step_dir_name
from lerobot_ckpt.objects import TrainingObjects
from lerobot_ckpt.pretrained import pretrained_weights_file, stored_float_dtype, weights_sha256
from lerobot_ckpt.state.record import (
    Artifacts,
    BaseModel,
    CheckpointFormat,
    Parallelism,
    RunInfo,
    TrainingStepRecord,
    package_versions,
    read_training_step,
)

if TYPE_CHECKING:
    from lerobot_ckpt.async_save import AsyncCheckpointer, CompletedSave
    from lerobot_ckpt.convert.merge import ConvertResult, convert_dcp
    from lerobot_ckpt.load import ResumeState, load_checkpoint
    from lerobot_ckpt.safetensors.files import read_tensors, write_tensors
    from lerobot_ckpt.save import save_checkpoint
    from lerobot_ckpt.state.model import unwrap_model

_LAZY = {
    "AsyncCheckpointer": "lerobot_ckpt.async_save",
    "CompletedSave": "lerobot_ckpt.async_save",
    "save_checkpoint": "lerobot_ckpt.save",
    "load_checkpoint": "lerobot_ckpt.load",
    "ResumeState": "lerobot_ckpt.load",
    "unwrap_model": "lerobot_ckpt.state.model",
    "read_tensors": "lerobot_ckpt.safetensors.files",
    "write_tensors": "lerobot_ckpt.safetensors.files",
    "convert_dcp": "lerobot_ckpt.convert.merge",  # torch-free itself, but it loads the DCP reader
    "ConvertResult": "lerobot_ckpt.convert.merge",
}

__all__ = [
    "Artifacts",
    "AsyncCheckpointer",
    "BaseModel",
    "CheckpointConfigError",
    "CheckpointError",
    "CheckpointFormat",
    "CheckpointNotFoundError",
    "CheckpointPaths",
    "CheckpointSaveError",
    "CheckpointWriteError",
    "CompletedSave",
    "ConvertResult",
    "CorruptCheckpointError",
    "InsufficientDiskSpaceError",
    "LegacyCheckpointError",
    "LockHolder",
    "MissingCheckpointFileError",
    "ModelMismatchError",
    "OptimizerMismatchError",
    "OutputExistsError",
    "Parallelism",
    "ResumeState",
    "RunDirectoryError",
    "RunDirectoryLockedError",
    "RunInfo",
    "RunLock",
    "StateMismatchError",
    "TrainingObjects",
    "TrainingStepRecord",
    "UnsafeCheckpointError",
    "UnsupportedCheckpointError",
    "checkpoints_dir",
    "convert_dcp",
    "fsync_dir",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "newer_checkpoints",
    "package_versions",
    "pretrained_weights_file",
    "push_to_hub",
    "read_last",
    "read_tensors",
    "read_training_step",
    "remove_quietly",
    "resolve_checkpoint_dir",
    "resolve_last",
    "save_checkpoint",
    "set_aside",
    "step_dir_name",
    "stored_float_dtype",
    "transient_leftovers",
    "unwrap_model",
    "weights_sha256",
    "write_tensors",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            module = importlib.import_module(_LAZY[name])
        except ModuleNotFoundError as exc:
            if not torch_missing(exc):
                raise
            raise ImportError(
                f"lerobot_ckpt.{name} needs torch, which is not installed: {INSTALL} "
                "(lerobot-convert-dcp alone runs without it)"
            ) from None
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lerobot_ckpt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
