"""Per-sample host values: the batch entries no wrapper or placement moves to the device.

The dataset ``index`` seeds pi0's, diffusion's and FastWAM's per-sample draws, which those policies make
on the host (``index.tolist()``); a device copy would cost an upload and a blocking read back every step.
:data:`HOST_KEYS` is the one declaration: lerobot-trainloop's placement (``move_to_device``) and a
pre-processor that places early (lerobot-cli's ``DeviceStep``) read it, and so does the sharded root here.

Wrappers move inputs themselves: DDP with ``device_ids`` (``wrap_model`` passes none), and FSDP2's root
pre-forward, which copies every input tensor to a CUDA device with no option to leave one alone.
:func:`keep_host_values` takes the host values out of the root's mapping arguments before that hook and
puts them back after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

HOST_KEYS: frozenset[str] = frozenset({"index"})


def _held(value: Any, host_keys: frozenset[str]) -> dict[str, torch.Tensor]:
    """The host-memory tensors of ``value`` (a mapping) under ``host_keys``; {} for anything else."""
    if not isinstance(value, Mapping):
        return {}
    return {
        k: v
        for k, v in value.items()
        if k in host_keys and isinstance(v, torch.Tensor) and v.device.type == "cpu"
    }


def _without(value: Mapping, held: dict[str, torch.Tensor]) -> Mapping:
    rest = {k: v for k, v in value.items() if k not in held}
    return rest if type(value) is dict else type(value)(rest)


def _restored(moved: Mapping, original: Mapping, held: dict[str, torch.Tensor]) -> Mapping:
    """``moved`` with ``held`` back in, in ``original``'s key order."""
    merged = {k: held[k] if k in held else moved[k] for k in original}
    return merged if type(moved) is dict else type(moved)(merged)


def keep_host_values(root: nn.Module, host_keys: frozenset[str] = HOST_KEYS) -> None:
    """Around ``root``'s forward pre-hooks (call after ``fully_shard(root)``): a hook placed first takes
    ``host_keys``' host tensors out of every mapping argument, one placed last puts them back, so the
    hooks in between (FSDP2's input move) never see them. Positional and keyword arguments alike;
    nested mappings are not searched (a batch is the top-level dict)."""
    pending: list[dict[int | str, tuple[Mapping, dict[str, torch.Tensor]]]] = []  # one per call in flight

    def take(module, args, kwargs):
        taken: dict[int | str, tuple[Mapping, dict[str, torch.Tensor]]] = {}
        new_args = list(args)
        for i, value in enumerate(args):
            if held := _held(value, host_keys):
                taken[i] = (value, held)
                new_args[i] = _without(value, held)
        new_kwargs = dict(kwargs)
        for name, value in kwargs.items():
            if held := _held(value, host_keys):
                taken[name] = (value, held)
                new_kwargs[name] = _without(value, held)
        pending.append(taken)
        return (tuple(new_args), new_kwargs) if taken else None

    def give_back(module, args, kwargs):
        taken = pending.pop()
        if not taken:
            return None
        new_args, new_kwargs = list(args), dict(kwargs)
        for where, (original, held) in taken.items():
            if isinstance(where, int):
                new_args[where] = _restored(new_args[where], original, held)
            else:
                new_kwargs[where] = _restored(new_kwargs[where], original, held)
        return tuple(new_args), new_kwargs

    root.register_forward_pre_hook(take, prepend=True, with_kwargs=True)
    root.register_forward_pre_hook(give_back, with_kwargs=True)
