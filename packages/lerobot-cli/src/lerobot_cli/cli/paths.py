"""Where ``--config_path`` and ``--policy.path`` point: files, checkpoint dirs, or Hub repos."""

from __future__ import annotations

import re
from pathlib import Path

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.configio import POLICY_CONFIG_NAME, TRAIN_CONFIG_NAME

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_config_path(value: str) -> Path:
    """Accept the file itself, ``pretrained_model/``, a step dir or ``checkpoints/last``."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    for candidate in (path / TRAIN_CONFIG_NAME, path / "pretrained_model" / TRAIN_CONFIG_NAME):
        if candidate.is_file():
            return candidate
    if path.is_dir():
        raise UsageError(
            f"--config_path={value}: no {TRAIN_CONFIG_NAME} in that directory or its pretrained_model/"
        )
    raise UsageError(f"--config_path={value} does not exist")


def resolve_policy_dir(value: str) -> Path:
    """A local pretrained_model dir (or a step dir holding one), else a Hub model repo id."""
    path = Path(value).expanduser()
    for candidate in (path, path / "pretrained_model"):
        if (candidate / POLICY_CONFIG_NAME).is_file():
            return candidate
    if path.exists():
        raise UsageError(f"--policy.path={value}: no {POLICY_CONFIG_NAME} there or in its pretrained_model/")
    if not _REPO_ID.match(value):
        raise UsageError(f"--policy.path={value} is neither an existing directory nor a Hub repo id (owner/name)")
    return _download_policy(value)


def _download_policy(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=repo_id, repo_type="model"))
    except Exception as exc:  # any transport or auth failure is one user-facing sentence
        raise UsageError(
            f"--policy.path={repo_id}: not a local directory, and downloading it from the Hub failed "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'})"
        ) from None
