"""Which weights file a ``pretrained_model/`` directory offers to ``from_pretrained`` / ``--policy.path``.

Torch-free, so a CLI can check a path before importing anything heavy. A directory holding only
DCP shards (``--checkpoint_format=dcp``) is refused with the command that fixes it, instead of
failing later inside a model loader that has never heard of DCP.
"""

from __future__ import annotations

from pathlib import Path

from lerobot_ckpt.errors import MissingCheckpointFileError, UnsupportedCheckpointError
from lerobot_ckpt.layout import (
    ADAPTER_WEIGHTS,
    MODEL_DCP_DIR,
    MODEL_WEIGHTS,
    PRETRAINED_MODEL_DIR,
)

CONVERTER = "lerobot-convert-dcp"


def pretrained_dir_of(path: Path | str) -> Path:
    """``pretrained_model/`` for a step directory, the directory itself otherwise."""
    p = Path(path).expanduser()
    return p / PRETRAINED_MODEL_DIR if (p / PRETRAINED_MODEL_DIR).is_dir() else p


def pretrained_weights_file(path: Path | str) -> Path:
    """``model.safetensors`` or (PEFT) ``adapter_model.safetensors`` of a pretrained directory.

    Raises :class:`UnsupportedCheckpointError` when only ``pytorch_model_fsdp_0/`` is there (convert
    it first with ``lerobot-convert-dcp``), :class:`MissingCheckpointFileError` when no weights are.
    """
    directory = pretrained_dir_of(path)
    for name in (MODEL_WEIGHTS, ADAPTER_WEIGHTS):
        if (directory / name).is_file():
            return directory / name
    if (directory / MODEL_DCP_DIR).is_dir():
        raise UnsupportedCheckpointError(
            f"{directory} holds its weights only as DCP shards ({MODEL_DCP_DIR}/, written by "
            f"--checkpoint_format=dcp), which cannot be loaded as a pretrained model; convert them first: "
            f"{CONVERTER} --checkpoint_dir={directory}"
        )
    raise MissingCheckpointFileError(directory / MODEL_WEIGHTS, f"no {MODEL_WEIGHTS} or {ADAPTER_WEIGHTS} in {directory}")
