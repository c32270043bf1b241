"""Apply a :class:`~lerobot_parallel.plan.ShardingPlan` with ``fully_shard`` on the runtime's mesh.

A 1-D mesh ``("dp_shard",)`` gives FSDP (``Shard(0)``); the 2-D ``("dp_replicate", "dp_shard")``
gives HSDP (``(Replicate(), Shard(0))``: reduce-scatter inside a shard group, all-reduce across
replicas) from the very same call. Units are sharded children-first, then the root takes the
parameters no unit took. Parameter objects are replaced by sharded ``DTensor`` parameters in
place, so the module stays the user's module and the optimizer must be built *after* this.

Ignored modules are passed as ``ignored_params``: FSDP neither shards nor moves them and, unlike
DDP, does not reduce their gradients either. Left alone, every rank would train its own copy and
the replicas would drift apart silently, so :func:`average_gradients` averages those gradients
over the data-parallel group after each synchronising backward. :func:`apply_sharding` returns
them, and ``wrap_model`` keeps them on the ``WrappedModel`` whose ``gradient_sync`` does it.

Methods that run instead of ``forward`` are registered with ``register_fsdp_forward_method`` so they gather
like ``forward``: a unit member's ``_fsdp_forward_methods`` (pi0's ``joint``), and on the root LeRobot's
inference entry points (:data:`ROOT_FORWARD_METHODS`, those the model has) plus its class's own
``_fsdp_forward_methods``. Without that, ``policy.predict_action_chunk(batch)`` on a sharded policy would use
the root's parameters (those no unit took: embeddings, encoders, heads) as shards and fail.

The root's forward keeps the batch's per-sample host values (``host_values.HOST_KEYS``) out of FSDP2's
root input move, which would copy them to a CUDA device for the policy to read back every step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard, register_fsdp_forward_method

from lerobot_parallel.host_values import keep_host_values
from lerobot_parallel.plan import ShardingPlan
from lerobot_parallel.runtime import ParallelRuntime

# LeRobot's inference entry points, called on the policy (the FSDP root) instead of forward.
ROOT_FORWARD_METHODS = ("predict_action_chunk", "select_action")


def offload_policy(cpu_offload: bool) -> OffloadPolicy:
    """``CPUOffloadPolicy`` pins host memory only when CUDA exists: pinning needs the CUDA driver and
    raises on CPU-only builds (measured on torch 2.15)."""
    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()


@torch.no_grad()
def upcast_trainable(model: nn.Module) -> list[str]:
    """Make every trainable floating parameter fp32 (the master copy mixed precision updates)."""
    changed = []
    for name, p in model.named_parameters():
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.to(torch.float32)
            changed.append(name)
    return changed


def apply_sharding(
    model: nn.Module, runtime: ParallelRuntime, plan: ShardingPlan
) -> tuple[nn.Module, tuple[nn.Parameter, ...]]:
    """Shard ``model`` in place on ``runtime.mesh`` as ``plan`` says (``wrap_model`` checked that they
    belong together). Returns ``model`` (now an ``FSDPModule``) and its trainable ignored parameters
    in model order (the same on every rank), whose gradients FSDP will not reduce."""
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
    common = {
        "mesh": runtime.mesh,
        "reshard_after_forward": reshard,
        "offload_policy": offload,
        "ignored_params": ignored or None,
    }
    for unit in plan.shard_order():
        members = [model.get_submodule(p) for p in unit.paths]
        fully_shard(members if unit.members else members[0], mp_policy=unit_mp, **common)
        for member in members:
            # Methods that run instead of forward (a joint layer's) gather the unit like forward does.
            for method in getattr(type(member), "_fsdp_forward_methods", ()):
                register_fsdp_forward_method(member, method)
    fully_shard(model, mp_policy=root_mp, **common)
    keep_host_values(model)  # FSDP's root pre-forward would copy the batch's index to the device
    for method in root_forward_methods(model):
        register_fsdp_forward_method(model, method)
    return model, tuple(p for p in model.parameters() if p in ignored and p.requires_grad)


def root_forward_methods(model: nn.Module) -> tuple[str, ...]:
    """The root's methods that run instead of ``forward`` (registered so they gather the root's own
    parameters): those of :data:`ROOT_FORWARD_METHODS` the model has (a PEFT wrapper has its policy's),
    then the ones its class declares in ``_fsdp_forward_methods``."""
    present = [name for name in ROOT_FORWARD_METHODS if callable(getattr(model, name, None))]
    if callable(getattr(type(model), "predict_action_chunk", None)):
        # A policy's own select_action pops its queue and refills it through self.predict_action_chunk,
        # which is registered: registering select_action too would nest the root's hooks, reshard the root
        # at the outer exit and all-gather on every pop. A wrapper (PEFT) reaching its policy's methods
        # through __getattr__ calls the policy's unregistered predict_action_chunk, so it keeps both.
        present = [name for name in present if name != "select_action"]
    return tuple(dict.fromkeys([*present, *getattr(type(model), "_fsdp_forward_methods", ())]))


@torch.no_grad()
def average_gradients(params: Sequence[nn.Parameter], group: dist.ProcessGroup | None, world: int) -> None:
    """Average the gradients of ``params`` (the ignored ones; FSDP reduces the rest in backward)
    over ``group`` of ``world`` ranks.

    Every rank sends every parameter (zeros for a missing gradient), one all-reduce per dtype, so
    the collectives match even when a branch was unused on some rank.
    """
    if not params or group is None:
        return
    by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
    for p in params:
        by_dtype.setdefault(p.dtype, []).append(p)
    for dtype in sorted(by_dtype, key=str):
        params_of = by_dtype[dtype]
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params_of]
        )
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        offset = 0
        for p in params_of:
            chunk = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
