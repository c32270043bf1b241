"""Apply a :class:`~lerobot_parallel.plan.ShardingPlan` with ``fully_shard`` on the runtime's mesh.

A 1-D mesh ``("dp_shard",)`` gives FSDP (``Shard(0)``); the 2-D ``("dp_replicate", "dp_shard")``
gives HSDP (``(Replicate(), Shard(0))``: reduce-scatter inside a shard group, all-reduce across
replicas) from the very same call. Units are sharded children-first, then the root takes the
parameters no unit took. Parameter objects are replaced by sharded ``DTensor`` parameters in
place, so the module stays the user's module and the optimizer must be built *after* this.

Ignored modules are passed as ``ignored_params``: FSDP neither shards nor moves them and, unlike
DDP, does not reduce their gradients either. Left alone, every rank would train its own copy and
the replicas would drift apart silently, so :func:`finish_gradient_sync` averages those gradients
over the data-parallel group after each synchronising backward (``gradient_sync`` calls it).
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

import torch
import torch.distributed as dist
from attrs import define
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

from lerobot_parallel.config import ShardingError
from lerobot_parallel.plan import ShardingPlan
from lerobot_parallel.runtime import ParallelRuntime


@define(frozen=True)
class _ShardedState:
    ignored: tuple[nn.Parameter, ...]  # trainable ignored parameters, in model order (same on every rank)
    group: dist.ProcessGroup | None
    world: int


_STATE: WeakKeyDictionary[nn.Module, _ShardedState] = WeakKeyDictionary()


def offload_policy(cpu_offload: bool) -> OffloadPolicy:
    """``CPUOffloadPolicy`` pins host memory only when CUDA exists: pinning needs the CUDA driver and
    raises on CPU-only builds (measured on torch 2.15)."""
    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()


def _check_plan(plan: ShardingPlan, runtime: ParallelRuntime) -> None:
    p = runtime.parallelism
    if (plan.dp_replicate, plan.dp_shard) != (p.dp_replicate, p.dp_shard) or not plan.is_sharded:
        raise ShardingError(
            f"the sharding plan was built for {plan.mode} (dp_replicate={plan.dp_replicate} x "
            f"dp_shard={plan.dp_shard}) but this runtime is {p.mode} (dp_replicate={p.dp_replicate} x "
            f"dp_shard={p.dp_shard}); build the plan from runtime.parallelism"
        )
    if runtime.mesh is None or tuple(runtime.mesh.mesh_dim_names or ()) != plan.mesh_dim_names:
        raise ShardingError(f"the runtime's mesh {runtime.mesh} does not have the plan's dims {plan.mesh_dim_names}")


@torch.no_grad()
def upcast_trainable(model: nn.Module) -> list[str]:
    """Make every trainable floating parameter fp32 (the master copy mixed precision updates)."""
    changed = []
    for name, p in model.named_parameters():
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.to(torch.float32)
            changed.append(name)
    return changed


def apply_sharding(model: nn.Module, runtime: ParallelRuntime, plan: ShardingPlan) -> nn.Module:
    """Shard ``model`` in place as ``plan`` says; returns ``model`` (now an ``FSDPModule``)."""
    _check_plan(plan, runtime)
    unit_mp, root_mp = plan.precision.policies()
    offload = offload_policy(plan.cpu_offload)
    ignored_modules = [model.get_submodule(m.path) for m in plan.ignored]
    ignored = {p for m in ignored_modules for p in m.parameters()}
    if plan.precision.upcast_trainable:
        upcast_trainable(model)
    for module in ignored_modules:
        module.to(runtime.device)  # FSDP moves only what it manages
    # None = torch's choice: reshard units after forward, keep the root gathered (backward needs it first).
    reshard = None if plan.reshard_after_forward else False
    common = {"mesh": runtime.mesh, "reshard_after_forward": reshard, "offload_policy": offload,
              "ignored_params": ignored or None}
    for path in plan.shard_order():
        fully_shard(model.get_submodule(path), mp_policy=unit_mp, **common)
    fully_shard(model, mp_policy=root_mp, **common)
    _STATE[model] = _ShardedState(
        ignored=tuple(p for p in model.parameters() if p in ignored and p.requires_grad),
        group=runtime.dp_group, world=runtime.dp_world_size,
    )
    return model


def ignored_parameters(model: nn.Module) -> tuple[nn.Parameter, ...]:
    """The trainable parameters sharding left unsharded (empty for any other model)."""
    state = _STATE.get(model)
    return () if state is None else state.ignored


@torch.no_grad()
def finish_gradient_sync(model: nn.Module) -> None:
    """Average the ignored parameters' gradients over the dp group (FSDP does the rest in backward).

    Every rank sends every ignored parameter (zeros for a missing gradient), one all-reduce per
    dtype, so the collectives match even when a branch was unused on some rank.
    """
    state = _STATE.get(model)
    if state is None or not state.ignored or state.group is None:
        return
    by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
    for p in state.ignored:
        by_dtype.setdefault(p.dtype, []).append(p)
    for dtype in sorted(by_dtype, key=str):
        params = by_dtype[dtype]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        dist.all_reduce(flat, group=state.group)
        flat.div_(state.world)
        offset = 0
        for p in params:
            chunk = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)
