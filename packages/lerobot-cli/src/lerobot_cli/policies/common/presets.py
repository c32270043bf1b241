"""LeRobot's optimizer and scheduler presets for policies that name them by the same config fields
(pi0, pi05, SmolVLA: ``AdamWConfig`` and ``CosineDecayWithWarmupSchedulerConfig`` built from
``optimizer_*`` / ``scheduler_*``). Functions of the fields, so each config keeps its own defaults."""

from __future__ import annotations

from typing import Protocol

from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig


class AdamWCosineFields(Protocol):
    """The config fields the presets read (LeRobot's names)."""

    optimizer_lr: float
    optimizer_betas: tuple[float, float]
    optimizer_eps: float
    optimizer_weight_decay: float
    optimizer_grad_clip_norm: float
    scheduler_warmup_steps: int
    scheduler_decay_steps: int
    scheduler_decay_lr: float


def adamw_preset(config: AdamWCosineFields) -> OptimizerConfig:
    return OptimizerConfig(
        type="adamw",
        lr=config.optimizer_lr,
        betas=config.optimizer_betas,
        eps=config.optimizer_eps,
        weight_decay=config.optimizer_weight_decay,
        grad_clip_norm=config.optimizer_grad_clip_norm,
    )


def cosine_decay_with_warmup_preset(config: AdamWCosineFields) -> SchedulerConfig:
    """Warm-up to ``optimizer_lr``, then cosine decay to ``scheduler_decay_lr`` (LeRobot's schedule)."""
    return SchedulerConfig(
        type="cosine_decay_with_warmup",
        num_warmup_steps=config.scheduler_warmup_steps,
        num_decay_steps=config.scheduler_decay_steps,
        peak_lr=config.optimizer_lr,
        decay_lr=config.scheduler_decay_lr,
    )
