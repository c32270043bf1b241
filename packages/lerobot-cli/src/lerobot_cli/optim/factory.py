"""torch optimizer and LR scheduler from their configs.

The scheduler is a ``LambdaLR`` stepped once per loop step (never per optimizer update and never
scaled by the number of processes), so its ``state_dict`` is a plain step counter that resumes anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from lerobot_cli.errors import ConfigError
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig


def build_optimizer(cfg: OptimizerConfig, params: Iterable[Any]) -> torch.optim.Optimizer:
    """The optimizer ``cfg`` names over ``params`` (tensors or param-group dicts).

    ``fused=True`` is checked here, where the parameters' devices are known, against torch's own rule
    (every parameter floating point, on a device type with fused kernels): torch would only raise at
    the first ``step()``, deep in a traceback, after the model was built and sharded."""
    params = list(params)
    impl = {"fused": cfg.fused, "foreach": cfg.foreach}
    if cfg.fused:
        _check_fused_supported(params)
    if cfg.type == "adamw":
        return torch.optim.AdamW(
            params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, **impl
        )
    if cfg.type == "adam":
        return torch.optim.Adam(
            params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, **impl
        )
    if cfg.type == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **impl
        )
    raise ValueError(f"--optimizer.type: invalid choice {cfg.type!r}")


def _tensors(params: list[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for p in params:
        out.extend(p["params"] if isinstance(p, dict) else [p])
    return out


def _check_fused_supported(params: list[Any]) -> None:
    """Refuse ``fused=True`` (a :class:`ConfigError`, exit 2) unless torch has a fused kernel for every
    parameter: torch's rule, ``_device_dtype_check_for_fused``, is a floating-point dtype on one of
    ``_get_fused_kernels_supported_devices()`` (cuda, cpu, mps, xpu, … as of torch 2.15)."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        supported = list(_get_fused_kernels_supported_devices())
    except ImportError:  # a torch without the helper: let torch itself decide
        return
    bad = sorted(
        {
            f"{p.dtype} on {p.device.type}"
            for p in _tensors(params)
            if p.device.type not in supported or not torch.is_floating_point(p)
        }
    )
    if bad:
        raise ConfigError(
            "--optimizer.fused=true needs floating-point parameters on a device with fused optimizer kernels "
            f"({', '.join(supported)}), but some are {', '.join(bad)}: leave --optimizer.fused unset "
            "(torch's choice) or set it to false"
        )


def lr_factor(cfg: SchedulerConfig, base_lr: float, total_steps: int):
    """Multiplier of ``base_lr`` at a step, LeRobot's formulas for both schedule types.

    ``cosine_decay_with_warmup``: linear warm-up from ``1/(W+1)`` of the peak, then a cosine from the
    peak (as if it began at step 0) down to ``decay_lr`` at ``decay``. ``constant_with_warmup``: linear
    warm-up from 0, then the peak. ``diffuser_cosine``: diffusers' ``get_scheduler("cosine")``, which
    LeRobot's Diffusion Policy preset uses: linear warm-up from 0, then one half cosine from the peak at
    the warm-up's end to 0 at ``decay`` (``--steps`` by default)."""
    peak = cfg.peak_lr if cfg.peak_lr is not None else base_lr
    scale = peak / base_lr if base_lr > 0 else 0.0
    warmup, decay = cfg.fitted_steps(total_steps)
    floor = cfg.decay_lr / peak if peak > 0 else 0.0

    def factor(step: int) -> float:
        if cfg.type == "constant_with_warmup":
            return scale * (step / max(1, warmup) if step < warmup else 1.0)
        if cfg.type == "diffuser_cosine":
            if step < warmup:
                return scale * step / max(1, warmup)
            progress = (step - warmup) / max(1, decay - warmup)
            return scale * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
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


def _place_steps(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> None:
    """Put a group's restored Adam ``step`` counters where its implementation keeps them: on the
    parameter's device (float32) for fused/capturable, on the host otherwise. ``load_state_dict`` placed
    them for the *saved* implementation, so a resume that changes ``--optimizer.fused`` would otherwise
    hand a fused CUDA kernel host counters (or the host path device ones, one read per step)."""
    on_device = bool(group.get("fused") or group.get("capturable"))
    for p in group["params"]:
        step = optimizer.state.get(p, {}).get("step")
        if isinstance(step, torch.Tensor):
            where = p.device if on_device else torch.device("cpu")
            if step.device != where:
                optimizer.state[p]["step"] = step.to(device=where, dtype=torch.float32)


def reapply_settings(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    settings: list[dict[str, Any]],
) -> None:
    """Make a resumed optimizer use the run's configured hyperparameters again.

    ``load_state_dict`` restores the saved param groups, lr and betas included, so a changed
    ``--optimizer.lr`` would be ignored. This writes ``settings`` (taken from the optimizer as built
    from the new config, before the load) back into the groups, keeps the restored moments and
    step counts, and puts the schedule on the new base lrs at the restored step.
    """
    if len(settings) != len(optimizer.param_groups):
        raise ValueError(
            f"{len(settings)} configured param groups for {len(optimizer.param_groups)} restored ones"
        )
    for group, wanted in zip(optimizer.param_groups, settings, strict=True):
        group.update(wanted)
        _place_steps(optimizer, group)
    if scheduler is None:
        return
    base = [w["lr"] for w in settings]
    scheduler.base_lrs = list(base)
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:
        raise TypeError(
            f"cannot re-base a {type(scheduler).__name__}; only LambdaLR schedules are built here"
        )
    lrs = [b * lam(scheduler.last_epoch) for b, lam in zip(base, lambdas, strict=True)]
    for group, b, lr in zip(optimizer.param_groups, base, lrs, strict=True):
        group["initial_lr"], group["lr"] = b, lr
    scheduler._last_lr = list(lrs)
