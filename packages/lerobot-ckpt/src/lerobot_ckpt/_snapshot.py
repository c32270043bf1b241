"""Copies of training state taken at the save step, so an asynchronous save may write them later.

The live tensors (parameters, optimizer moments, DTensor shards) keep changing once training goes
on; a background write must read something that does not. Every tensor is copied into fresh CPU
memory here, on the training thread, before the step loop resumes: the one part of an
asynchronous save that stalls training (torch's ``DefaultStager`` does the same, without pinned
memory, by default). DTensors stay DTensors (same mesh, placements and global shape, a CPU local
shard), so DCP plans the copy exactly as it would the live state.

Tensors that share one view of one storage (tied weights) stay shared in the copy, so
``write_tensors`` still finds the tie and writes the same file (one tensor plus a header alias) as
a synchronous save. Anything that is not a tensor is deep-copied (param-group values, scheduler
counters, the sampler's and the loop's JSON state).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor

_ViewKey = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype, str]


def _view_key(t: torch.Tensor) -> _ViewKey | None:
    """Identity of one view of one storage; None for tensors without data
    (empty ones share a null pointer)."""
    if t.numel() == 0 or isinstance(t, DTensor):
        return None
    return (
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        tuple(t.stride()),
        t.dtype,
        str(t.device),
    )


def copy_tensor(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy that never aliases ``t`` (``Tensor.to("cpu")`` of a CPU tensor would return ``t``)."""
    t = t.detach()
    return t.clone() if t.device.type == "cpu" else t.to("cpu")


def snapshot(value: Any, memo: dict[_ViewKey, torch.Tensor] | None = None) -> Any:
    """``value`` with every tensor copied to CPU (ties kept) and everything else deep-copied."""
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        key = _view_key(value)
        if key is not None and key in memo:
            return memo[key]
        out = copy_tensor(value)
        if key is not None:
            memo[key] = out
        return out
    if isinstance(value, dict):  # OrderedDict (module state dicts) and other subclasses keep their type
        out_dict = copy.copy(value)
        for k, v in value.items():
            out_dict[k] = snapshot(v, memo)
        return out_dict
    if isinstance(value, Mapping):
        return {k: snapshot(v, memo) for k, v in value.items()}
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(snapshot(v, memo) for v in value)
    return copy.deepcopy(value)


class FrozenState:
    """A scheduler's or loss scaler's ``state_dict()`` as it was at the save step.

    It stands in for the live object in the background phase, which only calls ``state_dict()``
    and, for a scaler, ``is_enabled()`` (see ``state.scheduler_scaler.scaler_enabled``).
    """

    def __init__(self, obj: Any) -> None:
        self._state = snapshot(obj.state_dict())
        self._enabled = bool(getattr(obj, "is_enabled", lambda: True)())

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def is_enabled(self) -> bool:
        return self._enabled
