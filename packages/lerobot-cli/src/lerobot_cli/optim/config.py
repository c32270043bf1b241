"""Optimizer and scheduler configs; a policy supplies presets, flags override single fields."""

from __future__ import annotations

from attrs import define, field
from lerobot_parallel.validators import choice

OPTIMIZER_TYPES = ("adamw", "adam", "sgd")
SCHEDULER_TYPES = ("cosine_decay_with_warmup", "constant_with_warmup", "diffuser_cosine")


def _one_of(flag: str, choices: tuple[str, ...], default: str, help: str):
    """A field taking one of ``choices`` (checked, and listed by ``--help``)."""
    metadata = {"help": help, "choices": choices}
    return field(default=default, validator=choice(flag, choices), metadata=metadata)


def _non_negative(flag: str, default: float | None, help: str):
    """A number field that must be ≥ 0 (``None``, where it is the default, means "not set")."""

    def check(inst, attribute, value) -> None:
        if value is not None and value < 0:
            raise ValueError(f"{flag} must be ≥ 0, got {value!r}")

    return field(default=default, validator=check, metadata={"help": help})


@define(frozen=True)
class OptimizerConfig:
    type: str = _one_of("--optimizer.type", OPTIMIZER_TYPES, "adamw", "Optimizer class.")
    lr: float = _non_negative(
        "--optimizer.lr", 1e-4, "Learning rate (never scaled automatically with the batch)."
    )
    weight_decay: float = _non_negative("--optimizer.weight_decay", 0.0, "Weight decay.")
    betas: tuple[float, float] = field(
        default=(0.9, 0.999), converter=tuple, metadata={"help": "Adam betas as a JSON list of two numbers."}
    )
    eps: float = field(default=1e-8, metadata={"help": "Adam epsilon."})
    momentum: float = field(default=0.0, metadata={"help": "SGD momentum."})
    grad_clip_norm: float | None = _non_negative(
        "--optimizer.grad_clip_norm",
        None,
        "Clip the global gradient norm before each update (null: no clipping).",
    )
    # Implementation choices of torch's optimizers (not LeRobot fields; null keeps torch's own choice, so
    # the defaults train exactly as before). The update is the same math either way.
    fused: bool | None = field(
        default=None,
        metadata={
            "help": (
                "Fused optimizer kernel (one kernel for all parameters; on CUDA its step counters stay on "
                "the GPU, so the update never reads the device). null: torch's choice; true is refused at "
                "start-up where the parameters' device has no fused kernel."
            )
        },
    )
    foreach: bool | None = field(
        default=None,
        metadata={
            "help": (
                "Multi-tensor (foreach) optimizer implementation. null: torch's choice (foreach on CUDA)."
            )
        },
    )

    def __attrs_post_init__(self) -> None:
        if len(self.betas) != 2:
            raise ValueError(
                f"--optimizer.betas must be a JSON list of two numbers, got {list(self.betas)!r}"
            )
        if self.fused and self.foreach:
            raise ValueError(
                "--optimizer.fused and --optimizer.foreach cannot both be true: pick one "
                "implementation (fused is the faster where it is supported)"
            )


@define(frozen=True)
class SchedulerConfig:
    """LR schedule stepped once per loop step; ``peak_lr`` defaults to the optimizer's lr."""

    type: str = _one_of("--scheduler.type", SCHEDULER_TYPES, "cosine_decay_with_warmup", "Schedule shape.")
    num_warmup_steps: int = _non_negative(
        "--scheduler.num_warmup_steps", 0, "Linear warm-up from 0 to peak_lr over this many steps."
    )
    num_decay_steps: int | None = _non_negative(
        "--scheduler.num_decay_steps", None, "Cosine decay length in steps (default: --steps)."
    )
    peak_lr: float | None = _non_negative(
        "--scheduler.peak_lr", None, "LR after warm-up (default: --optimizer.lr)."
    )
    decay_lr: float = _non_negative("--scheduler.decay_lr", 0.0, "LR at the end of the decay.")

    def fitted_steps(self, total_steps: int) -> tuple[int, int]:
        """``(warmup, decay)`` steps of the schedule for a run of ``total_steps``.

        LeRobot's rule for its cosine schedule: a run shorter than ``num_decay_steps`` squeezes the whole
        schedule into the run (warm-up scaled by the same factor, truncated to an int; decay = the run),
        so pi0's 1,000 + 30,000-step preset still warms up and decays in a 3,000-step fine-tune.
        """
        decay = self.num_decay_steps if self.num_decay_steps is not None else total_steps
        if self.type == "cosine_decay_with_warmup" and 0 < total_steps < decay:
            return int(self.num_warmup_steps * total_steps / decay), total_steps
        return self.num_warmup_steps, decay
