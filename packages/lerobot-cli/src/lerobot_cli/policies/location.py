"""Where a pretrained policy lives: a local ``pretrained_model/`` (or a step directory holding one),
else a Hugging Face Hub model repo, downloaded into the Hub cache.

A layer below the command line: the PEFT loader resolves the base an adapter names the same way a
``--policy.path`` is resolved, without reaching up into the CLI. Errors are plain sentences about
the value; the CLI adds the flag.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lerobot_ckpt.errors import UnsafeCheckpointError
from lerobot_ckpt.layout import POLICY_CONFIG
from lerobot_ckpt.pretrained import pretrained_dir_of

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def links_root(directory: str | Path) -> Path | None:
    """The Hugging Face cache repository (``.../models--org--name``) when ``directory`` is one of its
    snapshots (``.../snapshots/<rev>/``, or a folder inside one), else None.

    A snapshot's files are symlinks into that repository's own ``blobs/``: the one layout where a
    pretrained directory's files may be symlinks (``lerobot_ckpt.paths``' ``allow_links_within``). The
    path is taken as given, not resolved, so a symlinked directory cannot claim to be a snapshot."""
    path = Path(directory).absolute()
    for child in (path, *path.parents):
        if child.parent.name == "snapshots" and child.parent.parent.name.startswith("models--"):
            return child.parent.parent
    return None


def own_file(directory: str | Path, name: str) -> Path:
    """``directory / name`` (a fixed name: ``config.json``, ``adapter_config.json``, …) when it is the
    directory's own file: a symlink there would make a run read (and save as its own) a file from
    anywhere on the disk, so it is refused in one line unless it points into the Hub cache repository
    the directory is a snapshot of. A missing file is left to the caller's own sentence."""
    path = Path(directory) / name
    if not path.is_symlink():
        return path
    root = links_root(directory)
    try:
        inside = root is not None and path.resolve(strict=True).is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        raise UnsafeCheckpointError(
            f"{path} is a symlink (to {os.readlink(path)}), so it was not read: a pretrained directory's "
            "files are read only when they are its own (symlinks only in a Hugging Face cache snapshot, "
            "into its blobs/); copy the file in instead"
        )
    return path


class PolicyLocationError(ValueError):
    """The value names neither a local pretrained policy nor a downloadable Hub repo."""


def resolve_policy_dir(value: str) -> Path:
    path = Path(value).expanduser()
    try:  # a symlinked pretrained_model/ would train another model: only a Hub snapshot's links pass
        directory = pretrained_dir_of(path, allow_links_within=links_root(path))
    except UnsafeCheckpointError as exc:
        raise PolicyLocationError(f"{value}: {exc}") from None
    if (directory / POLICY_CONFIG).is_file():
        return directory
    if path.exists():
        raise PolicyLocationError(f"{value}: no {POLICY_CONFIG} there or in its pretrained_model/")
    if not _REPO_ID.match(value):
        raise PolicyLocationError(f"{value} is neither an existing directory nor a Hub repo id (owner/name)")
    return _download_policy(value)


def _download_policy(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=repo_id, repo_type="model"))
    except Exception as exc:  # noqa: BLE001 - any transport or auth failure is one user-facing sentence
        detail = str(exc).splitlines()[0] if str(exc) else "no detail"
        raise PolicyLocationError(
            f"{repo_id}: not a local directory, and downloading it from the Hub failed "
            f"({type(exc).__name__}: {detail})"
        ) from None
