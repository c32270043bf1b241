"""torch is an extra of lerobot-ckpt (``lerobot-ckpt[torch]``): saying so in one line where it is missing.

``pip install lerobot-ckpt`` is the standalone converter: ``lerobot-convert-dcp`` copies and casts
bytes without torch, whose CUDA wheels are gigabytes. Saving, loading and resharding training state
(and decoding the rare shard record that is not a plain tensor) need torch; reaching one of those
without it ends in one sentence naming the extra, never a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

from types import ModuleType

TORCH_EXTRA = "lerobot-ckpt[torch]"
INSTALL = f"pip install '{TORCH_EXTRA}'"


def torch_missing(error: ModuleNotFoundError) -> bool:
    """True when ``error`` is torch itself (or one of its modules) being absent."""
    return (error.name or "").split(".")[0] == "torch"


def require_torch(purpose: str) -> ModuleType:
    """``torch``, or :class:`UnsupportedCheckpointError` saying ``purpose`` needs the extra."""
    try:
        import torch
    except ModuleNotFoundError as exc:
        if not torch_missing(exc):
            raise
        from lerobot_ckpt.errors import UnsupportedCheckpointError

        raise UnsupportedCheckpointError(
            f"{purpose} needs torch, which is not installed: {INSTALL}"
        ) from None
    return torch
