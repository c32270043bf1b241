"""Model weights as ``pretrained_model/model.safetensors`` (the non-sharded artifact).

Loading checks the file against the model before touching it, so a mismatch (another policy, a
changed config) is reported by key and shape and leaves the model as it was; ``load_state_dict``
alone would fail half-way or, with ``strict=False``, silently keep random weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from lerobot_ckpt.errors import CorruptCheckpointError, ModelMismatchError
from lerobot_ckpt.safetensors.files import read_tensors

SHOWN = 5  # names listed per kind of mismatch; the rest are counted
log = logging.getLogger(__name__)


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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensor(path: Path, name: str, tensor: torch.Tensor, own: torch.Tensor) -> bool:
    """Refuse a stored tensor whose kind differs from the model's (an integer where it holds a float,
    or the reverse: ``load_state_dict`` would cast it silently) or a float one holding NaN/inf (it would
    train or be published as NaN), in one line naming the file and the tensor. True when floats of
    another width are converted on load (the caller says so once)."""
    if tensor.dtype != own.dtype and not (tensor.is_floating_point() and own.is_floating_point()):
        raise ModelMismatchError(
            f"{path}: tensor {name} is stored as {_dtype_name(tensor.dtype)} where the model holds "
            f"{_dtype_name(own.dtype)}; it is not loaded, since casting it would change its values"
        )
    if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
        raise CorruptCheckpointError(path, f"tensor {name} holds NaN or infinite values")
    return tensor.dtype != own.dtype


def check_values(path: Path, tensors: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> None:
    """:func:`check_tensor` for each of ``tensors`` the model holds; one warning for converted floats."""
    converted = [
        name for name, t in tensors.items() if name in own and check_tensor(path, name, t, own[name])
    ]
    warn_converted(path, converted)


def warn_converted(path: Path, converted: list[str]) -> None:
    if converted:
        log.warning(
            "%s: %d tensors are stored in another float type than the model holds, converted on load "
            "(e.g. %s)",
            path,
            len(converted),
            converted[0],
        )


def read_checked_weights(path: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """The file's tensors, verified to fit ``model`` key by key, shape by shape and in kind (no integer
    where a float belongs), with finite values."""
    tensors, _ = read_tensors(path)
    own = unwrap_model(model).state_dict()
    problem = mismatch(own, tensors)
    if problem:
        raise ModelMismatchError(f"{path} does not match the model: {problem}")
    check_values(path, tensors, own)
    return tensors


def apply_weights(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        unwrap_model(model).load_state_dict(tensors, strict=True)
