"""Model weights as ``pretrained_model/model.safetensors`` (the non-sharded artifact).

Loading checks the file against the model before touching it, so a mismatch (another policy, a
changed config) is reported by key and shape and leaves the model as it was; ``load_state_dict``
alone would fail half-way or, with ``strict=False``, silently keep random weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from lerobot_ckpt.errors import ModelMismatchError
from lerobot_ckpt.safetensors.files import read_tensors

SHOWN = 5  # names listed per kind of mismatch; the rest are counted


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module whose ``state_dict`` keys are the policy's own: without DDP's ``module.`` prefix
    or ``torch.compile``'s ``_orig_mod.``, so checkpoints load whatever the wrapping was."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def few(names: Iterable[str], shown: int = SHOWN) -> str:
    items = sorted(names)
    text = ", ".join(items[:shown])
    return text + (f" (+{len(items) - shown} more)" if len(items) > shown else "")


def mismatch(
    expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor], *, subset: bool = False
) -> str | None:
    """What differs between the model's state dict and a checkpoint's, or None when they fit.

    ``subset``: ``expected`` is a part of the state (an EMA shadow's trainable parameters), so keys
    the checkpoint has beyond it are fine; every expected key must still be there, with its shape.
    """
    missing = expected.keys() - found.keys()
    unexpected = set() if subset else found.keys() - expected.keys()
    shapes = [
        f"{k} (checkpoint {tuple(found[k].shape)}, model {tuple(expected[k].shape)})"
        for k in sorted(expected.keys() & found.keys())
        if tuple(found[k].shape) != tuple(expected[k].shape)
    ]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing from the checkpoint: {few(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} not in the model: {few(unexpected)}")
    if shapes:
        parts.append(f"{len(shapes)} with another shape: {few(shapes)}")
    return "; ".join(parts) or None


def read_checked_weights(path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """The file's tensors, verified to fit ``model`` key by key and shape by shape."""
    tensors, _ = read_tensors(path)
    problem = mismatch(unwrap_model(model).state_dict(), tensors)
    if problem:
        raise ModelMismatchError(f"{path} does not match the model: {problem}")
    return tensors


def apply_weights(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        unwrap_model(model).load_state_dict(tensors, strict=True)
