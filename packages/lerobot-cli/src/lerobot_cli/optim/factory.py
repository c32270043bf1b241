"""torch optimizer and LR scheduler from their configs.

The scheduler is a ``LambdaLR`` stepped once per loop step (never per optimizer update and never
scaled by the number of processes), so its ``state_dict`` is a plain step counter that resumes anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig


def build_optimizer(cfg: OptimizerConfig, params: Iterable[Any]) -> torch.optim.Optimizer:
    params = list(params)
    if cfg.type == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.type == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.type == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    raise ValueError(f"--optimizer.type: invalid choice {cfg.type!r}")


def lr_factor(cfg: SchedulerConfig, base_lr: float, total_steps: int):
    """Multiplier of ``base_lr`` at a step, LeRobot's formulas for both schedule types.

    ``cosine_decay_with_warmup``: linear warm-up from ``1/(W+1)`` of the peak, then a cosine from the
    peak (as if it began at step 0) down to ``decay_lr`` at ``decay``. ``constant_with_warmup``: linear
    warm-up from 0, then the peak."""
    peak = cfg.peak_lr if cfg.peak_lr is not None else base_lr
    scale = peak / base_lr if base_lr > 0 else 0.0
    warmup, decay = cfg.fitted_steps(total_steps)
    floor = cfg.decay_lr / peak if peak > 0 else 0.0

    def factor(step: int) -> float:
        if cfg.type == "constant_with_warmup":
            return scale * (step / max(1, warmup) if step < warmup else 1.0)
        if step < warmup:
            start = 1 / (warmup + 1)
            return scale * ((start - 1) * (1 - step / warmup) + 1)
        cosine = 0.5 * (1 + math.cos(math.pi * min(step, decay) / max(1, decay)))
        return scale * ((1 - floor) * cosine + floor)

    return factor


def build_scheduler(
    cfg: SchedulerConfig | None, optimizer: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    if cfg is None:
        return None
    factors = [lr_factor(cfg, group["lr"], total_steps) for group in optimizer.param_groups]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=factors)


def optimizer_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The hyperparameters of each param group as configured (everything but the parameters)."""
    return [{k: v for k, v in g.items() if k not in ("params", "initial_lr")} for g in optimizer.param_groups]


def reapply_settings(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler | None,
                     settings: list[dict[str, Any]]) -> None:
    """Make a resumed optimizer use the run's configured hyperparameters again.

    ``load_state_dict`` restores the saved param groups, lr and betas included, so a changed
    ``--optimizer.lr`` would be ignored. This writes ``settings`` (taken from the optimizer as built
    from the new config, before the load) back into the groups, keeps the restored moments and
    step counts, and puts the schedule on the new base lrs at the restored step.
    """
    if len(settings) != len(optimizer.param_groups):
        raise ValueError(f"{len(settings)} configured param groups for {len(optimizer.param_groups)} restored ones")
    for group, wanted in zip(optimizer.param_groups, settings, strict=True):
        group.update(wanted)
    if scheduler is None:
        return
    base = [w["lr"] for w in settings]
    scheduler.base_lrs = list(base)
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:
        raise TypeError(f"cannot re-base a {type(scheduler).__name__}; only LambdaLR schedules are built here")
    lrs = [b * lam(scheduler.last_epoch) for b, lam in zip(base, lambdas, strict=True)]
    for group, b, lr in zip(optimizer.param_groups, base, lrs, strict=True):
        group["initial_lr"], group["lr"] = b, lr
    scheduler._last_lr = list(lrs)
