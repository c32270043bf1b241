"""Where ``--config_path`` and ``--policy.path`` point: files, checkpoint dirs, or Hub repos.

Checkpoint layouts are ``lerobot_ckpt``'s: a checkpoint is found by its discovery function, and no
file name is spelled here.
"""

from __future__ import annotations

from pathlib import Path

from lerobot_ckpt import CheckpointError, CheckpointPaths, resolve_checkpoint_dir
from lerobot_ckpt.layout import TRAIN_CONFIG

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.policies.location import PolicyLocationError
from lerobot_cli.policies.location import resolve_policy_dir as _resolve_policy_dir


def resolve_config_path(value: str) -> Path:
    """A ``train_config.json`` file, a directory holding one, or any path to a checkpoint
    (``pretrained_model/``, a step dir, ``checkpoints/last``, the run directory)."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    if (path / TRAIN_CONFIG).is_file():
        return path / TRAIN_CONFIG
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


def resolve_policy_dir(value: str) -> Path:
    """A local pretrained_model dir (or a step dir holding one), else a Hub model repo id."""
    try:
        return _resolve_policy_dir(value)
    except PolicyLocationError as exc:
        raise UsageError(f"--policy.path={exc}") from None
