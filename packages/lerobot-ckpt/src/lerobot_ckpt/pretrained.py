"""Which weights file a ``pretrained_model/`` directory offers to ``from_pretrained`` / ``--policy.path``.

Torch-free, so a CLI can check a path before importing anything heavy. A directory holding only
DCP shards (``--checkpoint_format=dcp``) is refused with the command that fixes it, instead of
failing later inside a model loader that has never heard of DCP.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections import Counter
from pathlib import Path

from lerobot_ckpt.errors import MissingCheckpointFileError, UnsupportedCheckpointError
from lerobot_ckpt.layout import (
    ADAPTER_WEIGHTS,
    MODEL_DCP_DIR,
    MODEL_WEIGHTS,
    PRETRAINED_MODEL_DIR,
)
from lerobot_ckpt.paths import LinkedLayoutError, _link_ok

CONVERTER = "lerobot-convert-dcp"
_FLOAT_DTYPES = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def pretrained_dir_of(path: Path | str, *, allow_links_within: Path | str | None = None) -> Path:
    """``pretrained_model/`` for a step directory, the directory itself otherwise.

    A ``pretrained_model/`` that is a symlink is refused (:class:`~lerobot_ckpt.paths.LinkedLayoutError`,
    one line): it would load another model than the one the directory holds, file-level checks
    passing. The one exception is a link that stays inside ``allow_links_within`` (a Hugging Face
    cache repository, for a snapshot). The path given is the user's, links above it included."""
    p = Path(path).expanduser()
    inner = p / PRETRAINED_MODEL_DIR
    if inner.is_symlink() and not _link_ok(
        inner, Path(allow_links_within) if allow_links_within is not None else None
    ):
        raise LinkedLayoutError(inner, f"a policy's {PRETRAINED_MODEL_DIR}/")
    return inner if inner.is_dir() else p


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
            f"checkpoint_format=dcp), which cannot be loaded as a pretrained model; convert them first: "
            f"{CONVERTER} --checkpoint_dir={directory}"
        )
    raise MissingCheckpointFileError(
        directory / MODEL_WEIGHTS, f"no {MODEL_WEIGHTS} or {ADAPTER_WEIGHTS} in {directory}"
    )


def stored_float_dtype(weights: Path | str) -> str:
    """The dtype most floating tensors of a safetensors file are stored in (``float32`` if none).

    Read from the header alone (8-byte length + JSON): no tensor is loaded, torch is not needed.
    """
    with Path(weights).open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    counts = Counter(
        _FLOAT_DTYPES[v["dtype"]]
        for k, v in header.items()
        if k != "__metadata__" and v.get("dtype") in _FLOAT_DTYPES
    )
    return counts.most_common(1)[0][0] if counts else "float32"


_HEX = frozenset("0123456789abcdef")


def weights_sha256(weights: Path | str) -> str:
    """SHA-256 of a weights file: what pins a frozen base so that a moved or retrained one is noticed.

    A file in the Hugging Face cache is a link to ``blobs/<sha256>``, named by the digest of its
    content (git-LFS), so that name is used without reading gigabytes; any other file is hashed
    (about 1 GB/s).
    """
    path = Path(weights)
    real = path.resolve()
    if real.parent.name == "blobs" and len(real.name) == 64 and set(real.name) <= _HEX:
        return real.name
    digest = hashlib.sha256()
    with real.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
