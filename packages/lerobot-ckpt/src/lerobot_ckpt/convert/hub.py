"""Publish a converted ``pretrained_model/`` as a Hub model repository, never its DCP shards.

The files are chosen by name from the checkpoint layout (an allow-list, not "everything but the
shards"), so nothing a user dropped next to them, no temporary file and no shard is uploaded. They
go up in one commit through ``HfApi.create_commit``; a model card is added when the directory has
none (the directory itself is not modified).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from lerobot_ckpt.errors import MissingCheckpointFileError
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


def files_to_upload(pretrained: Path) -> list[Path]:
    """Top-level files of ``pretrained`` that belong on the Hub, sorted; weights must be among them."""
    chosen = sorted(
        p
        for p in pretrained.iterdir()
        if p.is_file()
        and not p.name.startswith(".")
        and (p.name in UPLOADED_NAMES or any(fnmatch.fnmatchcase(p.name, g) for g in UPLOADED_GLOBS))
    )
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
