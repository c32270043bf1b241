"""Publish a converted ``pretrained_model/`` as a Hub model repository, never its DCP shards.

The files are chosen by name from the checkpoint layout (an allow-list, not "everything but the
shards"), so nothing a user dropped next to them, no temporary file and no shard is uploaded. They
go up in one commit through ``HfApi.create_commit``; a model card is added when the directory has
none (the directory itself is not modified). A publishable name that is a symlink is refused in
one line, before the conversion writes anything: a checkpoint someone sent could otherwise make the
upload publish any file on the disk under ``config.json``.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from lerobot_ckpt.errors import MissingCheckpointFileError, UnsafeCheckpointError
from lerobot_ckpt.layout import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    MODEL_CARD,
    MODEL_WEIGHTS,
    POLICY_CONFIG,
    POLICY_CONFIG_EXTENSIONS,
    POSTPROCESSOR_CONFIG,
    POSTPROCESSOR_STATE_GLOB,
    PREPROCESSOR_CONFIG,
    PREPROCESSOR_STATE_GLOB,
    TRAIN_CONFIG,
)

# config_extensions.json goes with config.json: without it our loader falls back to defaults for the settings
# LeRobot's config lacks (a tiny pi0 would then be rebuilt at full size).
UPLOADED_NAMES = (
    POLICY_CONFIG,
    POLICY_CONFIG_EXTENSIONS,
    TRAIN_CONFIG,
    MODEL_WEIGHTS,
    ADAPTER_WEIGHTS,
    ADAPTER_CONFIG,
    PREPROCESSOR_CONFIG,
    POSTPROCESSOR_CONFIG,
    MODEL_CARD,
)
UPLOADED_GLOBS = (PREPROCESSOR_STATE_GLOB, POSTPROCESSOR_STATE_GLOB)


def _publishable(name: str) -> bool:
    return not name.startswith(".") and (
        name in UPLOADED_NAMES or any(fnmatch.fnmatchcase(name, g) for g in UPLOADED_GLOBS)
    )


def refuse_linked_files(pretrained: Path) -> None:
    """One line when a file that would be published is a symlink: what goes up must be the
    checkpoint's own file, never one it points at (called before a conversion writes anything)."""
    for p in sorted(pretrained.iterdir()):
        if _publishable(p.name) and p.is_symlink():
            raise UnsafeCheckpointError(
                f"{p} is a symlink (to {os.readlink(p)}); --push_to_hub uploads only the checkpoint's own "
                "files, never what a symlink points at: replace it with the file itself (nothing was "
                "uploaded)"
            )


def files_to_upload(pretrained: Path) -> list[Path]:
    """Top-level files of ``pretrained`` that belong on the Hub, sorted; weights must be among them."""
    refuse_linked_files(pretrained)
    chosen = sorted(p for p in pretrained.iterdir() if _publishable(p.name) and p.is_file())
    if not any(p.name in (MODEL_WEIGHTS, ADAPTER_WEIGHTS) for p in chosen):
        raise MissingCheckpointFileError(pretrained / MODEL_WEIGHTS, "nothing to publish without weights")
    return chosen


def model_card(repo_id: str, pretrained: Path) -> str:
    peft = (pretrained / ADAPTER_CONFIG).is_file()
    kind = "a PEFT adapter" if peft else "a policy"
    return (
        "---\nlibrary_name: lerobot\ntags:\n- lerobot\n- robotics\n---\n\n"
        f"# {repo_id.split('/')[-1]}\n\n"
        f"This repository holds {kind} trained with LeRobot; its weights were merged from sharded (DCP) "
        "training checkpoints with `lerobot-convert-dcp`.\n\n"
        "Load it with `--policy.path=" + repo_id + "`.\n"
    )


def push_to_hub(
    pretrained: Path,
    repo_id: str,
    *,
    private: bool = False,
    api=None,
    card: str | None = None,
    commit_message: str = "Upload policy converted from DCP shards by lerobot-convert-dcp",
) -> list[str]:
    """Create (or reuse) ``repo_id`` and upload the publishable files; returns their repo paths.

    ``card`` replaces the default model card (a trainer knows more about the run than the converter).
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    api = api or HfApi()
    files = files_to_upload(pretrained)
    operations = [CommitOperationAdd(path_in_repo=p.name, path_or_fileobj=str(p)) for p in files]
    if card is not None or not (pretrained / MODEL_CARD).is_file():
        operations = [op for op in operations if op.path_in_repo != MODEL_CARD]
        text = card if card is not None else model_card(repo_id, pretrained)
        operations.append(CommitOperationAdd(path_in_repo=MODEL_CARD, path_or_fileobj=text.encode("utf-8")))
    api.create_repo(repo_id=repo_id, private=private, exist_ok=True, repo_type="model")
    api.create_commit(
        repo_id=repo_id, repo_type="model", operations=operations, commit_message=commit_message
    )
    return [op.path_in_repo for op in operations]
