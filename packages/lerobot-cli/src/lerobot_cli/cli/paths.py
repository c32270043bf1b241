"""Where ``--config_path`` and ``--policy.path`` point: files, checkpoint dirs, or Hub repos.

Checkpoint layouts are ``lerobot_ckpt``'s: a checkpoint is found by its discovery function, and no
file name is spelled here.
"""

from __future__ import annotations

import os
from pathlib import Path

from lerobot_ckpt import CheckpointError, CheckpointPaths, resolve_checkpoint_dir
from lerobot_ckpt.layout import PRETRAINED_MODEL_DIR, TRAIN_CONFIG, TRAINING_STATE_DIR

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.policies.location import PolicyLocationError
from lerobot_cli.policies.location import resolve_policy_dir as _resolve_policy_dir


def resolve_config_path(value: str) -> Path:
    """A ``train_config.json`` file, a directory holding one, or any path to a checkpoint
    (``pretrained_model/``, a step dir, ``checkpoints/last``, the run directory)."""
    path = Path(value).expanduser()
    if path.is_file():
        return _checked(path, value)
    if (path / TRAIN_CONFIG).is_file():
        return _checked(path / TRAIN_CONFIG, value)
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"--config_path={value} does not exist")
    try:
        candidate = CheckpointPaths(resolve_checkpoint_dir(path)).train_config
    except CheckpointError:
        candidate = None
    if candidate is not None and candidate.is_file():
        return candidate
    raise UsageError(
        f"--config_path={value}: no {TRAIN_CONFIG} in that directory, and it is not a checkpoint that has one"
    )


def _checked(config: Path, value: str) -> Path:
    """``config``, once a checkpoint's own (``<step>/pretrained_model/train_config.json`` beside a
    ``training_state/``) is checked as one before it is read: a symlink in its layout (the file, its
    directory, the step directory) could make the resume read, and write into, another run."""
    step = config.parent.parent
    if config.parent.name == PRETRAINED_MODEL_DIR and os.path.lexists(step / TRAINING_STATE_DIR):
        try:
            resolve_checkpoint_dir(config)
        except CheckpointError as exc:
            raise UsageError(f"--config_path={value}: {exc}") from None
    return config


def resolve_policy_dir(value: str) -> Path:
    """A local pretrained_model dir (or a step dir holding one), else a Hub model repo id."""
    try:
        return _resolve_policy_dir(value)
    except PolicyLocationError as exc:
        raise UsageError(f"--policy.path={exc}") from None
