"""Apply a :class:`ShardingPlan` to a model, and keep what the wrapped model's step needs.

:func:`wrap_model` does exactly what the plan says (built once by :func:`build_plan`, where every
refusal happens): one process → the plain module on the runtime's device; several processes,
unsharded → DDP; ``dp_shard > 1`` → FSDP2 (1-D mesh) or HSDP (2-D mesh) with ``fully_shard``.

It returns a :class:`WrappedModel`: the module to train *and* the state its gradient
synchronisation needs (the plan, the runtime with its mesh and dp group, the ignored parameters
whose gradients FSDP does not reduce). That state lives on the object the caller holds, not in a
registry keyed by module, so what :meth:`WrappedModel.gradient_sync` does is visible from the
object it is called on. It is the one switch the loop uses to skip gradient communication on
non-final accumulation micro-batches, whatever the wrapper is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from attrs import define
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lerobot_parallel.errors import ParallelismError, ShardingError
from lerobot_parallel.plan import ShardingPlan
from lerobot_parallel.regions import apply_regions
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.sharding import apply_sharding, average_gradients


@define(frozen=True, eq=False)
class WrappedModel:
    """What :func:`wrap_model` made: ``model`` (plain, DDP or sharded) and the state its step needs.

    Call ``model``, optimise ``model.parameters()`` and checkpoint ``model``; use
    :meth:`gradient_sync` around forward+backward and :meth:`parameters_for_clipping` for the norm.
    """

    model: nn.Module  # the module to run: the user's module, DDP around it, or the user's module sharded
    plan: ShardingPlan  # what was applied
    runtime: ParallelRuntime  # the mesh it was sharded on and the dp group gradients are averaged over
    ignored: tuple[nn.Parameter, ...] = ()  # trainable parameters FSDP left unsharded (model order)

    @property
    def module(self) -> nn.Module:
        """The module :func:`wrap_model` was given: under DDP, or ``model`` itself when it is plain or
        sharded (``fully_shard`` works in place).

        This undoes what :func:`wrap_model` applied, nothing more; for the module whose ``state_dict``
        keys are the policy's own under any wrapper (``torch.compile`` included), a checkpoint writer
        uses ``lerobot_ckpt.unwrap_model``.
        """
        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model

    @contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        """Run forward+backward with gradient communication on or off.

        DDP needs *both* forward and backward inside ``no_sync()``. FSDP2/HSDP skip reduce-scatter and
        all-reduce while ``set_requires_gradient_sync(False)`` (unsharded gradients accumulate locally
        until the synchronising micro-batch); after a synchronising backward the ignored parameters'
        gradients are averaged over the dp group. A single process has no communication.
        """
        if self.plan.is_sharded:
            self.model.set_requires_gradient_sync(enabled)
            try:
                yield
            finally:
                if not enabled:
                    self.model.set_requires_gradient_sync(
                        True
                    )  # the default, for callers outside this context
            if enabled:
                average_gradients(self.ignored, self.runtime.dp_group, self.runtime.dp_world_size)
            return
        if not enabled and isinstance(self.model, DistributedDataParallel):
            with self.model.no_sync():
                yield
            return
        yield

    def parameters_for_clipping(self) -> list[torch.Tensor]:
        """Parameters whose gradients enter the clip norm (those that require grad).

        Under FSDP these are the sharded ``DTensor`` parameters (and any ignored plain ones): clip them
        with :func:`lerobot_parallel.grad_clip.clip_grad_norm`, which handles both.
        """
        return [p for p in self.model.parameters() if p.requires_grad]


def _check_plan_fits(plan: ShardingPlan, runtime: ParallelRuntime) -> None:
    """A plan built for one topology must not be applied on another (e.g. reused across sessions)."""
    p = runtime.parallelism
    if (plan.dp_replicate, plan.dp_shard) != (p.dp_replicate, p.dp_shard):
        raise ShardingError(
            f"the sharding plan was built for {plan.mode} (dp_replicate={plan.dp_replicate} x "
            f"dp_shard={plan.dp_shard}) but this runtime is {p.mode} (dp_replicate={p.dp_replicate} x "
            f"dp_shard={p.dp_shard}); build the plan with build_plan(model, runtime)"
        )
    if plan.mode != "single" and runtime.mesh is None:
        raise ParallelismError(
            f"a {plan.mode} plan needs a runtime that joined its process group (init_runtime or "
            "parallel_session); this one has no device mesh (ParallelRuntime.preview is for planning only)"
        )


def wrap_model(model: nn.Module, runtime: ParallelRuntime, plan: ShardingPlan) -> WrappedModel:
    """Move ``model`` to the runtime's device and wrap or shard it exactly as ``plan`` says (with
    activation checkpointing and compile of its blocks first, when the plan has them).

    Build ``plan`` with ``build_plan(model, runtime, accelerator)`` (print ``plan.describe()`` first if
    you like). Build the optimizer on the returned ``.model``'s parameters *after* this call: sharding
    replaces the parameter objects.
    """
    _check_plan_fits(plan, runtime)
    # Activation checkpointing, then compile, on the plan's blocks, before fully_shard / DDP (the order
    # torch supports: the FSDP hooks stay outside the compiled, checkpointed region).
    if plan.activation_checkpointing != "none" or plan.compile.enabled:
        apply_regions(
            model, plan.block_paths, checkpointing=plan.activation_checkpointing, compile_config=plan.compile
        )
    if plan.is_sharded:
        sharded, ignored = apply_sharding(model, runtime, plan)
        return WrappedModel(model=sharded, plan=plan, runtime=runtime, ignored=ignored)
    model = model.to(runtime.device)
    if plan.mode == "single":
        return WrappedModel(model=model, plan=plan, runtime=runtime)
    ddp = plan.ddp
    # device_ids=None on every device (torch's documented choice for a single-device module as well): with
    # device_ids, DDP's forward copies every input tensor to that device itself, so the per-sample host
    # values the loop's placement leaves on the host (host_values.HOST_KEYS) would be uploaded and read
    # back with a sync every step. The caller places its batches (TrainLoop does).
    wrapped = DistributedDataParallel(
        model,
        device_ids=None,
        process_group=runtime.dp_group,
        find_unused_parameters=ddp.find_unused_parameters,
        # torch 2.15 deprecates broadcast_buffers in favour of forward_sync_buffers (same per-forward sync)
        forward_sync_buffers=ddp.broadcast_buffers,
        gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        bucket_cap_mb=ddp.bucket_cap_mb,
    )
    return WrappedModel(model=wrapped, plan=plan, runtime=runtime)
