"""Where a dataset's files are: ``--dataset.root``, the LeRobot cache, or the Hugging Face Hub.

Same places and order as LeRobot, so a dataset LeRobot already downloaded (``$HF_LEROBOT_HOME/<repo_id>``)
is reused as is and a download lands where LeRobot would put it.
"""

from __future__ import annotations

import os
from pathlib import Path

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.config import DatasetConfig
from lerobot_cli.datasets.errors import DatasetError


def lerobot_home() -> Path:
    """``$HF_LEROBOT_HOME``, else ``$HF_HOME/lerobot`` (``~/.cache/huggingface/lerobot``), like LeRobot."""
    if os.environ.get("HF_LEROBOT_HOME"):
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(hf_home).expanduser() / "lerobot"


def _has_info(root: Path) -> bool:
    return (root / L.INFO_PATH).is_file()


def local_dataset_root(cfg: DatasetConfig) -> Path | None:
    """Where ``resolve_dataset_root`` would find the dataset without downloading anything; None when it would
    have to download it (or ``--dataset.root`` holds no dataset: its own error says so later)."""
    if cfg.root is not None:
        root = Path(cfg.root).expanduser()
    elif cfg.repo_id:
        root = lerobot_home() / cfg.repo_id
    else:
        return None
    return root if _has_info(root) else None


def resolve_dataset_root(cfg: DatasetConfig) -> Path:
    """Local root of the dataset ``cfg`` names, downloading it from the Hub only when it is nowhere local.

    ``cfg.root`` is used as is (never downloaded into); otherwise ``$HF_LEROBOT_HOME/<repo_id>``, filled
    with ``huggingface_hub.snapshot_download(repo_type="dataset")`` when it has no ``meta/info.json``.
    """
    if cfg.root is not None:
        root = Path(cfg.root).expanduser()
        if not _has_info(root):
            raise DatasetError(
                f"--dataset.root={cfg.root}: missing file {root / L.INFO_PATH}; point it at a LeRobot v3.0 "
                "dataset directory (the one holding meta/, data/ and videos/)"
            )
        return root
    if not cfg.repo_id:
        raise DatasetError(
            "no dataset given: pass --dataset.repo_id=<user>/<name> (and optionally --dataset.root)"
        )
    root = lerobot_home() / cfg.repo_id
    if _has_info(root):
        return root
    import huggingface_hub  # deferred: only a cache miss needs it

    try:
        huggingface_hub.snapshot_download(
            cfg.repo_id, repo_type="dataset", local_dir=str(root), revision=cfg.revision
        )
    except Exception as err:  # offline, unknown repo, auth, disk: all end the same way for the user
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
        raise DatasetError(
            f"dataset {cfg.repo_id!r} not found: no {root / L.INFO_PATH} (set $HF_LEROBOT_HOME or "
            f"--dataset.root to a local copy) and the Hub download failed ({reason})"
        ) from err
    if not _has_info(root):
        raise DatasetError(
            f"dataset {cfg.repo_id!r} downloaded from the Hub into {root} has no {L.INFO_PATH}; "
            "it is not a LeRobot dataset (or --dataset.revision points at the wrong branch)"
        )
    return root
