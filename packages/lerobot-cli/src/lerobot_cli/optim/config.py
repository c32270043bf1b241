"""Optimizer and scheduler configs; a policy supplies presets, flags override single fields."""

from __future__ import annotations

from attrs import define, field
from lerobot_parallel.validators import choice

OPTIMIZER_TYPES = ("adamw", "adam", "sgd")
SCHEDULER_TYPES = ("cosine_decay_with_warmup", "constant_with_warmup")


def _non_negative(flag: str):
    def check(inst, attribute, value) -> None:
        if value is not None and value < 0:
            raise ValueError(f"{flag} must be ≥ 0, got {value!r}")

    return check


@define(frozen=True)
class OptimizerConfig:
    type: str = field(
        default="adamw", validator=choice("--optimizer.type", OPTIMIZER_TYPES),
        metadata={"help": "Optimizer class.", "choices": OPTIMIZER_TYPES},
    )
    lr: float = field(
        default=1e-4, validator=_non_negative("--optimizer.lr"),
        metadata={"help": "Learning rate (never scaled automatically with the batch)."},
    )
    weight_decay: float = field(
        default=0.0, validator=_non_negative("--optimizer.weight_decay"), metadata={"help": "Weight decay."}
    )
    betas: tuple[float, float] = field(
        default=(0.9, 0.999), converter=tuple, metadata={"help": "Adam betas as a JSON list of two numbers."}
    )
    eps: float = field(default=1e-8, metadata={"help": "Adam epsilon."})
    momentum: float = field(default=0.0, metadata={"help": "SGD momentum."})
    grad_clip_norm: float | None = field(
        default=None, validator=_non_negative("--optimizer.grad_clip_norm"),
        metadata={"help": "Clip the global gradient norm before each update (null: no clipping)."},
    )

    def __attrs_post_init__(self) -> None:
        if len(self.betas) != 2:
            raise ValueError(f"--optimizer.betas must be a JSON list of two numbers, got {list(self.betas)!r}")


@define(frozen=True)
class SchedulerConfig:
    """LR schedule stepped once per loop step; ``peak_lr`` defaults to the optimizer's lr."""

    type: str = field(
        default="cosine_decay_with_warmup", validator=choice("--scheduler.type", SCHEDULER_TYPES),
        metadata={"help": "Schedule shape.", "choices": SCHEDULER_TYPES},
    )
    num_warmup_steps: int = field(
        default=0, validator=_non_negative("--scheduler.num_warmup_steps"),
        metadata={"help": "Linear warm-up from 0 to peak_lr over this many steps."},
    )
    num_decay_steps: int | None = field(
        default=None, validator=_non_negative("--scheduler.num_decay_steps"),
        metadata={"help": "Cosine decay length in steps (default: --steps)."},
    )
    peak_lr: float | None = field(
        default=None, validator=_non_negative("--scheduler.peak_lr"),
        metadata={"help": "LR after warm-up (default: --optimizer.lr)."},
    )
    decay_lr: float = field(
        default=0.0, validator=_non_negative("--scheduler.decay_lr"), metadata={"help": "LR at the end of the decay."}
    )
