"""Apply the data-parallel wrapper the runtime's topology calls for.

The decision lives here, not in the trainer, so every caller gets the same mapping:
one process → the plain module (no wrapper, no hooks, nothing to unwrap on save);
several processes with no sharding → ``DistributedDataParallel``; ``dp_shard > 1`` → FSDP2
(1-D mesh) or HSDP (2-D mesh) with ``fully_shard``, following a :class:`ShardingPlan` that is
checked before any collective.

:func:`gradient_sync` is the one switch the loop uses to skip gradient communication on
non-final accumulation micro-batches, whatever the wrapper is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from lerobot_parallel.config import DDPConfig, FSDPConfig
from lerobot_parallel.plan import ShardingPlan, build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.sharding import apply_sharding, finish_gradient_sync


def wrap_model(
    model: nn.Module,
    runtime: ParallelRuntime,
    ddp: DDPConfig | None = None,
    fsdp: FSDPConfig | None = None,
    *,
    mixed_precision: str = "no",
    default_wrap_modules: Sequence[str] | None = None,
    plan: ShardingPlan | None = None,
) -> nn.Module:
    """Move ``model`` to the runtime's device and wrap or shard it for the topology.

    Sharded topologies use ``plan`` when given (build it once with :func:`build_plan` to print it
    first), else build it here from ``fsdp``, ``mixed_precision`` and ``default_wrap_modules``
    (defaults to ``model._fsdp_wrap_modules``). Build the optimizer on the returned module's
    parameters *after* this call: sharding replaces the parameter objects.
    """
    if runtime.parallelism.is_sharded:
        if plan is None:
            plan = build_plan(model, runtime.parallelism, fsdp, mixed_precision,
                              default_wrap_modules=default_wrap_modules)
        return apply_sharding(model, runtime, plan)
    model = model.to(runtime.device)
    if runtime.world_size == 1:
        return model
    ddp = ddp or DDPConfig()
    return DistributedDataParallel(
        model,
        device_ids=[runtime.device.index] if runtime.device.type != "cpu" else None,
        process_group=runtime.dp_group,
        find_unused_parameters=ddp.find_unused_parameters,
        # torch 2.15 deprecates broadcast_buffers in favour of forward_sync_buffers (same per-forward sync)
        forward_sync_buffers=ddp.broadcast_buffers,
        gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        bucket_cap_mb=ddp.bucket_cap_mb,
    )


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module under any wrapper we applied (for saving, introspection, eval).

    A sharded model is the user's module itself (``fully_shard`` works in place).
    """
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Run forward+backward with gradient communication on or off.

    DDP needs *both* forward and backward inside ``no_sync()``. FSDP2/HSDP skip reduce-scatter and
    all-reduce while ``set_requires_gradient_sync(False)`` (unsharded gradients accumulate locally
    until the synchronising micro-batch); after a synchronising backward the ignored modules'
    gradients are averaged too. Other modules have no communication.
    """
    if not enabled and isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
        return
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        try:
            yield
        finally:
            if not enabled:
                model.set_requires_gradient_sync(True)  # the default, for callers outside this context
        if enabled:
            finish_gradient_sync(model)
        return
    yield


def is_wrapped(model: nn.Module) -> bool:
    return isinstance(model, DistributedDataParallel | FSDPModule)


def parameters_for_clipping(model: nn.Module) -> list[torch.Tensor]:
    """Parameters whose gradients enter the clip norm (those that require grad).

    Under FSDP these are the sharded ``DTensor`` parameters (and any ignored plain ones): clip them
    with :func:`lerobot_parallel.grad_clip.clip_grad_norm`, which handles both.
    """
    return [p for p in model.parameters() if p.requires_grad]
