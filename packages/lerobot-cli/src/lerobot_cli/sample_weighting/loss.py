"""The weighted training loss, put on the policy so the generic train loop (``loss, info = model(batch)``)
needs to know nothing of it.

LeRobot's ``update_policy``: ``per_sample_loss, info = policy.forward(batch, reduction="none")``, then
``loss = (per_sample_loss * w).sum() / (w.sum() + 1e-6)`` with ``w`` the weighter's weights of the batch,
and the weighter's per-batch stats logged as ``sample_weight_<name>``. :func:`weight_the_loss` does the same
with two hooks on the policy module (the one the run wraps with DDP/FSDP2; its forward hooks run inside the
wrapper, and its weights' names and the checkpoints are untouched): a forward pre-hook asks for
``reduction="none"``, a forward hook weights the result. Only in training mode: the held-out eval loss is the
unweighted mean, as LeRobot's eval (``policy.eval()``; ``policy.forward(batch)``).

Under DDP, FSDP2 and HSDP each rank weights its own micro-batch (weights normalised to its micro-batch size,
the weighted mean over it), as each of LeRobot's accelerate processes does; the gradients are then averaged
over ranks as for any loss. With gradient accumulation each micro-batch is weighted alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

LOSS_EPSILON = 1e-6  # LeRobot's update_policy, not --sample_weighting.epsilon


def weighted_mean(per_sample_loss: Tensor, weights: Tensor) -> Tensor:
    """LeRobot's weighted loss: ``(l * w).sum() / (w.sum() + 1e-6)``."""
    return (per_sample_loss * weights).sum() / (weights.sum() + LOSS_EPSILON)


def _batch_of(args: tuple, kwargs: dict) -> Any:
    return args[0] if args else kwargs.get("batch")


def weight_the_loss(policy: nn.Module, weighter) -> Callable[[], None]:
    """Make ``policy(batch)`` in training mode return LeRobot's weighted loss (``weighter``:
    ``compute_batch_weights(batch) -> (weights, stats)``); returns a function that removes the hooks."""

    def ask_per_sample(module: nn.Module, args: tuple, kwargs: dict):
        if not module.training:
            return None
        return args, {**kwargs, "reduction": "none"}

    def weight(module: nn.Module, args: tuple, kwargs: dict, output):
        if not module.training:
            return None
        per_sample_loss, info = output
        weights, stats = weighter.compute_batch_weights(_batch_of(args, kwargs))
        if per_sample_loss.shape != weights.shape:
            raise RuntimeError(
                f"--sample_weighting: {type(module).__name__}.forward(reduction='none') returned a loss of "
                f"shape {tuple(per_sample_loss.shape)}, not one per sample ({tuple(weights.shape)})"
            )
        loss = weighted_mean(per_sample_loss, weights.to(per_sample_loss.device))
        info = dict(info or {})
        for key, value in stats.items():
            if isinstance(value, int | float) and not isinstance(value, bool):  # LeRobot logs numbers only
                info[f"sample_weight_{key}"] = float(value)
        return loss, info

    handles = [
        policy.register_forward_pre_hook(ask_per_sample, with_kwargs=True),
        policy.register_forward_hook(weight, with_kwargs=True),
    ]

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


__all__ = ["LOSS_EPSILON", "weight_the_loss", "weighted_mean"]
