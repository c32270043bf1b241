"""Apply the data-parallel wrapper the runtime's topology calls for.

The decision lives here, not in the trainer, so every caller gets the same mapping:
one process → the plain module (no wrapper, no hooks, nothing to unwrap on save);
several processes with no sharding → ``DistributedDataParallel``. Sharded layouts (FSDP2,
HSDP) are refused until the FSDP work replaces :func:`_apply_sharding`.

:func:`gradient_sync` is the one switch the loop uses to skip gradient communication on
non-final accumulation micro-batches, whatever the wrapper is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lerobot_parallel.config import DDPConfig, FSDPConfig, ParallelismError
from lerobot_parallel.runtime import ParallelRuntime


def _apply_sharding(model: nn.Module, runtime: ParallelRuntime, fsdp: FSDPConfig | None) -> nn.Module:
    p = runtime.parallelism
    raise ParallelismError(
        f"--parallelism.dp_replicate={p.dp_replicate} --parallelism.dp_shard={p.dp_shard} asks for "
        f"{p.mode.upper()}, which is not available in this version: sharded training (FSDP2/HSDP) comes in a "
        "later version. Launch without --parallelism.* flags to train with DDP."
    )


def wrap_model(
    model: nn.Module,
    runtime: ParallelRuntime,
    ddp: DDPConfig | None = None,
    fsdp: FSDPConfig | None = None,
) -> nn.Module:
    """Move ``model`` to the runtime's device and wrap it for the topology.

    Build the optimizer on the returned module's parameters (or before wrapping: DDP shares
    the same parameter objects; FSDP will not, so prefer after).
    """
    if runtime.parallelism.is_sharded:
        return _apply_sharding(model, runtime, fsdp)
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
    """The user's module under any wrapper we applied (for saving, introspection, eval)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Run forward+backward with gradient communication on or off.

    DDP needs *both* forward and backward inside ``no_sync()``; other modules have no
    communication, so this is a no-op for them.
    """
    if not enabled and isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
        return
    with nullcontext():
        yield


def is_wrapped(model: nn.Module) -> bool:
    return isinstance(model, DistributedDataParallel)


def parameters_for_clipping(model: nn.Module) -> list[torch.Tensor]:
    """Parameters whose gradients enter the clip norm (those that require grad)."""
    return [p for p in model.parameters() if p.requires_grad]
