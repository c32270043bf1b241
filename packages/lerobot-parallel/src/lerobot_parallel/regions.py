"""Activation checkpointing and regional compile of the plan's blocks, in place.

The blocks are the wrap units (or, unsharded, the policy's declared units): the one list that drives
activation checkpointing, compile and ``fully_shard``, applied in that order by ``wrap_model`` (the
order torch and torchtitan support: checkpointing inside compile inside the FSDP hooks).

Both transforms replace a block's ``forward`` (and the methods it declares in
``_fsdp_forward_methods``, which run instead of ``forward`` in a joint layer) with an instance
attribute that wraps the class's own method. Nothing is re-parented, so every parameter keeps its
name: state dicts, DCP shards, optimizer keys and PEFT paths are those of the plain policy, and a
checkpoint written with checkpointing or compile on loads with them off and the other way round.
``fully_shard`` then hooks the module's ``__call__`` and ``register_fsdp_forward_method`` wraps the
replaced method, so FSDP's gathers stay eager around the compiled region, and the recomputation in
backward runs after FSDP's pre-backward gather of the same unit.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from lerobot_parallel.config import CompileConfig
from lerobot_parallel.errors import ShardingError

# Ops whose outputs ``selective`` keeps: matmuls, convolutions and attention kernels, the expensive ones.
# Everything else in a block (norms, activations, softmax, dropout, elementwise) is recomputed.
_SAVED_OP_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
)


def _saved_ops() -> frozenset[Any]:
    aten = torch.ops.aten
    return frozenset(getattr(aten, name) for name in _SAVED_OP_NAMES if hasattr(aten, name))


def _selective_policy(saved: frozenset[Any]) -> Callable[..., CheckpointPolicy]:
    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        packet = getattr(op, "_overloadpacket", op)
        return CheckpointPolicy.MUST_SAVE if packet in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


# respect_saved_tensors_hooks (torch ≥ 2.12): what selective keeps goes through the caller's saved-tensor
# hooks (offloading, counting) like every other saved tensor; older torch (LeRobot's 2.11) has no such
# argument and keeps those tensors outside the hooks, which changes nothing this package does with them.
_HOOKS_SEE_SAC_SAVES = (
    {"respect_saved_tensors_hooks": True}
    if "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters
    else {}
)


def checkpointed(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """``fn`` run under non-reentrant ``torch.utils.checkpoint`` (``full``) or selective checkpointing.

    Non-reentrant: it supports keyword arguments and inputs that need no grad, nests under FSDP2's
    backward hooks, and replays the RNG state (dropout recomputes the same mask). Without grad mode
    (evaluation, inference) ``fn`` runs as is: there is no backward to save for.
    """
    if mode not in ("full", "selective"):
        raise ValueError(f"activation checkpointing mode must be full or selective, got {mode!r}")
    policy = _selective_policy(_saved_ops()) if mode == "selective" else None

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        if policy is None:
            return checkpoint(fn, *args, use_reentrant=False, **kwargs)
        return checkpoint(
            fn,
            *args,
            use_reentrant=False,
            **_HOOKS_SEE_SAC_SAVES,
            context_fn=functools.partial(create_selective_checkpoint_contexts, policy),
            **kwargs,
        )

    return run


def region_methods(module: nn.Module) -> tuple[str, ...]:
    """The methods that run a block: ``forward`` and those its class declares in ``_fsdp_forward_methods``."""
    return ("forward", *getattr(type(module), "_fsdp_forward_methods", ()))


class Region:
    """A block's method, checkpointed and/or compiled; set on the block as an instance attribute.

    It calls the method of the block's class (looked up at call time, so FSDP's subclassing and
    ``register_fsdp_forward_method`` wrapping this object keep working) on the block it belongs to.
    ``copy.deepcopy`` of the model (an EMA shadow, say) gives the copy a ``Region`` of its own, bound to
    the copied block: a plain closure would be shared and run the original's weights in the copy.
    """

    def __init__(
        self, module: nn.Module, name: str, checkpointing: str, compile_config: CompileConfig | None
    ) -> None:
        self.module, self.name = module, name
        self.checkpointing, self.compile_config = checkpointing, compile_config
        fn: Callable[..., Any] = self.original
        if checkpointing != "none":
            fn = checkpointed(fn, checkpointing)
        if compile_config is not None:
            fn = _compiled(fn, compile_config)
        self._run = fn

    def original(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(type(self.module), self.name)(self.module, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._run(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> Region:
        return Region(copy.deepcopy(self.module, memo), self.name, self.checkpointing, self.compile_config)

    def __repr__(self) -> str:
        done = [f"checkpoint={self.checkpointing}"] if self.checkpointing != "none" else []
        done += ["compiled"] if self.compile_config is not None else []
        return f"Region({type(self.module).__name__}.{self.name}, {', '.join(done)})"


def _compiled(fn: Callable[..., Any], config: CompileConfig) -> Callable[..., Any]:
    return torch.compile(fn, backend=config.backend, mode=config.mode)


def check_backend(config: CompileConfig) -> None:
    """An unknown backend name is refused at plan time, with the names this torch knows."""
    if not config.enabled:
        return
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if config.backend not in known:
        raise ShardingError(
            f"accelerator.compile.backend={config.backend}: torch.compile has no such backend; "
            f"valid: {', '.join(sorted(known))}"
        )


def apply_regions(
    model: nn.Module, blocks: Iterable[str], *, checkpointing: str, compile_config: CompileConfig
) -> None:
    """Checkpoint and/or compile each block of ``model`` (module paths) in place, then, with
    ``compile_config.regional=False``, compile the whole model (``nn.Module.compile``, in place).

    Applying twice to the same module is refused: a block checkpointed twice would recompute twice.
    """
    regional = compile_config.enabled and compile_config.regional
    for path in blocks:
        module = model.get_submodule(path)
        if any(isinstance(module.__dict__.get(name), Region) for name in region_methods(module)):
            raise ShardingError(
                f"{path or type(model).__name__}: activation checkpointing / compile was already "
                "applied to this module; build a fresh model for a new plan"
            )
        for name in region_methods(module):
            setattr(module, name, Region(module, name, checkpointing, compile_config if regional else None))
    if compile_config.enabled and not compile_config.regional:
        model.compile(backend=compile_config.backend, mode=compile_config.mode)
