"""FQN-keyed model and optimizer state of any topology, through ``torch.distributed.checkpoint.state_dict``.

``get_model_state_dict`` / ``get_optimizer_state_dict`` give the same keys for a plain module, a
DDP- or ``torch.compile``-wrapped one and an FSDP2/HSDP one (parameter FQNs, optimizer state keyed
by FQN instead of by index); only the values differ (full tensors or DTensor shards). That is
what makes resharding possible: a sharded checkpoint is read into whatever those functions
return for the *current* model. The tensors they return alias the live parameters and optimizer
buffers, so loading into them in place (DCP's contract, and ours for safetensors) restores the
model without a second copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from itertools import chain
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from lerobot_ckpt.errors import CheckpointConfigError
from lerobot_ckpt.state.model import unwrap_model

AdapterState = Callable[[dict[str, Any]], dict[str, Any]]


def is_sharded_model(model: nn.Module) -> bool:
    """True when any parameter or buffer is a DTensor (FSDP2/HSDP): loading is then collective."""
    return any(isinstance(t, DTensor) for t in chain(model.parameters(), model.buffers()))


def model_state(
    model: nn.Module,
    adapter_state: AdapterState | None = None,
    override: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The live state keyed by FQN (or by the caller's adapter keys, e.g. PEFT's file names);
    ``override`` replaces some entries first (an EMA shadow in place of the live parameters)."""
    state = with_override(get_model_state_dict(model), override)
    return adapter_state(state) if adapter_state is not None else state


def with_override(state: dict[str, Any], override: Mapping[str, torch.Tensor] | None) -> dict[str, Any]:
    """``state`` with ``override``'s entries in place of its own; every override key must be one of
    the state's (a shadow keyed by other names would silently save the live weights)."""
    if not override:
        return state
    unknown = override.keys() - state.keys()
    if unknown:
        raise CheckpointConfigError(
            f"{len(unknown)} EMA entries are not in the model's state dict: {', '.join(sorted(unknown)[:5])}"
        )
    return {**state, **override}


def tied_aliases(model: nn.Module, keys: Mapping[str, Any]) -> dict[str, str]:
    """``{alias: kept}`` for parameters registered under several names (tied weights).

    Decided from parameter identity, which is the same on every rank, never from storage
    pointers (empty shards on different parameters can share a null pointer).
    """
    names: dict[int, list[str]] = {}
    for name, param in unwrap_model(model).named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    aliases = {}
    for group in names.values():
        present = sorted(n for n in group if n in keys)
        aliases.update({n: present[0] for n in present[1:]})
    return aliases


def local_index(target: torch.Tensor) -> tuple[slice, ...] | None:
    """The slice of the global tensor this rank holds (None: the whole tensor)."""
    if not isinstance(target, DTensor):
        return None
    shape, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
    return tuple(slice(o, o + s) for s, o in zip(shape, offset, strict=True))


def local_tensor(target: torch.Tensor) -> torch.Tensor:
    return target.to_local() if isinstance(target, DTensor) else target


@contextmanager
def _no_grads(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """torch initialises an empty optimizer's state with a zero-gradient step, but skips that when a
    gradient exists; hide gradients meanwhile so a load after a forward/backward still gets state."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = [p.grad for p in params]
    if not optimizer.state:
        for p in params:
            p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, saved, strict=True):
            if g is not None:
                p.grad = g


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``{"state": {fqn: {...}}, "param_groups": [...]}`` aliasing the optimizer's live buffers.

    An optimizer that has not stepped yet gets its state created first (torch does a zero-gradient
    step with lr=0, which leaves the parameters unchanged), so there is something to load into.
    """
    with _no_grads(optimizer):
        return get_optimizer_state_dict(model, optimizer)


def apply_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], *, full: bool = False
) -> None:
    """Hand a loaded FQN-keyed state back to the optimizer; ``full=True``: every rank holds the
    whole (non-sharded) state and torch cuts each rank's shard out of it."""
    options = StateDictOptions(full_state_dict=True) if full else None
    with _no_grads(optimizer):
        set_optimizer_state_dict(model, optimizer, state, options=options)
    if full:  # torch's full-state path hands hyperparameters back re-containered (betas as a list)
        for live, saved in zip(optimizer.param_groups, state["param_groups"], strict=True):
            live.update({k: v for k, v in saved.items() if k != "params"})


def param_fqns(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """FQN of each optimizer parameter, in ``state_dict()`` index order (param groups concatenated).

    This is how an index-keyed optimizer file (``optimizer_state.safetensors``) maps onto FQNs: it
    assumes the optimizer was built over the parameters in the same order, which the non-sharded
    loader assumes as well.
    """
    by_param: dict[int, str] = {}
    for name, param in model.named_parameters():
        by_param.setdefault(id(param), name)
    state_keys = get_model_state_dict(model).keys()
    fqns = []
    for param in chain.from_iterable(g["params"] for g in optimizer.param_groups):
        name = by_param.get(id(param))
        if name is None:
            raise ValueError("an optimizer parameter does not belong to the model")
        fqns.append(_clean_fqn(name, state_keys))
    return fqns


def _clean_fqn(name: str, keys) -> str:
    """``module._orig_mod.x`` → ``x``: wrapper prefixes that get_model_state_dict drops too."""
    if name in keys:
        return name
    parts = [p for p in name.split(".") if p not in ("module", "_orig_mod")]
    return ".".join(parts)


def index_state_to_fqn(index_state: dict[str, Any], fqns: list[str]) -> dict[str, Any]:
    """An ``optimizer.state_dict()``-shaped dict (int keys) re-keyed by FQN, as torch's API expects."""
    state = {fqns[i]: dict(entries) for i, entries in index_state["state"].items()}
    groups = []
    for group in index_state["param_groups"]:
        groups.append({**group, "params": [fqns[i] for i in group["params"]]})
    return {"state": state, "param_groups": groups}
