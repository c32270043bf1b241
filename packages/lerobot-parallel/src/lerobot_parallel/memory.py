"""Per-rank bytes of parameters, gradients and optimizer state for a topology, before training.

Computed from the module tree alone, so ``--dry_run`` can show what a topology would cost
without a process group. The arithmetic follows what FSDP2 allocates: each sharded parameter
is split on dim 0 into ``dp_shard`` chunks *padded* to ``ceil(dim0 / dp_shard)`` rows (the
padded buffer is what every rank holds), gradients exist for trainable parameters only and
match the parameter's (master) dtype, and the optimizer keeps ``optimizer_states`` tensors of
that size per trainable parameter (AdamW: ``exp_avg`` and ``exp_avg_sq``; its scalar ``step``
counters are left out). Ignored parameters and every non-sharded topology hold full copies.
Transient memory (a unit's all-gathered parameters, activations) is not part of the estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from attrs import define
from torch import nn


@define(frozen=True)
class MemoryEstimate:
    """Bytes one rank holds between steps; ``unsharded_*`` is the same model without sharding (DDP)."""

    params: int
    grads: int
    optimizer: int
    unsharded_params: int
    unsharded_grads: int
    unsharded_optimizer: int
    optimizer_states: int
    location: str  # "device", or "cpu (offloaded)"
    # the part of ``params`` (and of ``unsharded_params``) that is frozen: held (sharded like the rest when
    # its module is), but with no gradient and no optimizer state, so a reader of the banner can tell a
    # frozen vision tower's bytes from the trained ones'
    frozen_params: int = 0
    unsharded_frozen_params: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def unsharded_total(self) -> int:
        return self.unsharded_params + self.unsharded_grads + self.unsharded_optimizer

    @property
    def ratio(self) -> float:
        """Per-rank total over the unsharded total (1/dp_shard plus padding, when all is sharded)."""
        return self.total / self.unsharded_total if self.unsharded_total else 1.0

    def describe(self) -> str:
        return (
            f"Estimated per-rank memory (params + grads + optimizer state, {self.optimizer_states} states "
            f"per trainable param): {format_bytes(self.params)} + {format_bytes(self.grads)} + "
            f"{format_bytes(self.optimizer)} = {format_bytes(self.total)} on {self.location} "
            f"({self.ratio:.3f}x of the unsharded {format_bytes(self.unsharded_total)})"
        )

    def describe_params(self) -> str | None:
        """The params split into trainable and frozen, or None when nothing is frozen. Why a line of its
        own: the total alone hides that a frozen tower, though sharded, costs parameters only."""
        if not self.frozen_params:
            return None
        trainable = self.params - self.frozen_params
        share = self.frozen_params / self.unsharded_frozen_params
        return (
            f"  params per rank: trainable {format_bytes(trainable)} (with the grads and optimizer state "
            f"above), frozen {format_bytes(self.frozen_params)} ({share:.3f}x of the unsharded "
            f"{format_bytes(self.unsharded_frozen_params)}; no grads, no optimizer state)"
        )


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def padded_shard_numel(shape: torch.Size | tuple[int, ...], shards: int) -> int:
    """Elements one rank allocates for a parameter of ``shape`` sharded on dim 0 over ``shards`` ranks."""
    if shards <= 1:
        return math.prod(shape)
    if len(shape) == 0:
        return 1  # a scalar is viewed as one row
    rows = -(-shape[0] // shards)
    return rows * math.prod(shape[1:])


def master_dtype(p: nn.Parameter, upcast_trainable: bool) -> torch.dtype:
    """The dtype a parameter is kept in while training (trainable ones become fp32 under mixed precision)."""
    if upcast_trainable and p.requires_grad and p.is_floating_point():
        return torch.float32
    return p.dtype


def estimate_memory(
    params: Iterable[nn.Parameter],
    *,
    dp_shard: int,
    ignored: frozenset[int] = frozenset(),
    upcast_trainable: bool = False,
    optimizer_states: int = 2,
    cpu_offload: bool = False,
) -> MemoryEstimate:
    """Estimate for ``params`` (each object once) sharded over ``dp_shard`` ranks (1: not sharded)."""
    totals = dict.fromkeys(("p", "g", "o", "up", "ug", "uo", "f", "uf"), 0)
    seen: set[int] = set()
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        itemsize = master_dtype(p, upcast_trainable).itemsize
        full = p.numel() * itemsize
        local = full if id(p) in ignored else padded_shard_numel(p.shape, dp_shard) * itemsize
        totals["p"] += local
        totals["up"] += full
        if p.requires_grad:
            totals["g"] += local
            totals["ug"] += full
            totals["o"] += optimizer_states * local
            totals["uo"] += optimizer_states * full
        else:
            totals["f"] += local
            totals["uf"] += full
    return MemoryEstimate(
        params=totals["p"],
        grads=totals["g"],
        optimizer=totals["o"],
        unsharded_params=totals["up"],
        unsharded_grads=totals["ug"],
        unsharded_optimizer=totals["uo"],
        optimizer_states=optimizer_states,
        location="cpu (offloaded)" if cpu_offload and dp_shard > 1 else "device",
        frozen_params=totals["f"],
        unsharded_frozen_params=totals["uf"],
    )


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind ``tensors`` on this rank, each storage once (a DTensor counts its local
    shard's storage: FSDP's padded buffer, which is what is allocated)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = (t.to_local() if hasattr(t, "to_local") else t).untyped_storage()
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(seen.values())


def measure_rank_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank actually holds now: parameter, gradient and optimizer-state storages.

    Counts each storage once (a DTensor's local shard is a view into FSDP's padded buffer, so the
    storage is what is allocated). Used by the memory benchmark and tests to check the estimate.
    """

    params = list(model.parameters())
    out = {
        "params": storage_bytes(params),
        "grads": storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        out["optimizer"] = storage_bytes(
            v
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        )
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out
