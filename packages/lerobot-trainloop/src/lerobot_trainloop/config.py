"""Torch-free configs of the loop's optional parts (importing them must not import torch: a CLI's
``--help`` and config validation stay fast). Messages name the config field (``ema.decay``); the
CLI shows it as its flag."""

from __future__ import annotations

import math

from attrs import define, field


def _bool(name: str):
    def check(inst, attribute, value) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")  # noqa: TRY004 - a usage error (exit 2)

    return check


def _number(name: str, valid: str, ok, optional: bool = False):
    def check(inst, attribute, value) -> None:
        if value is None and optional:
            return
        good = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and ok(value)
        )
        if not good:
            raise ValueError(f"{name} must be {valid}, got {value!r}")

    return check


@define(frozen=True)
class EmaConfig:
    """An exponential moving average (EMA) of the trainable weights, LeRobot's ``--ema.*`` fields.

    The decay follows diffusers' ``EMAModel`` warmup schedule, as LeRobot uses it: at the n-th update,
    with ``t = n - update_after_step - 1``, the decay is 0 while ``t ≤ 0`` (the shadow is a copy of the
    live weights), then ``1 - (1 + t / inv_gamma) ** -power`` clamped to ``[min_decay, max_decay]``.
    A constant ``decay`` (openpi's 0.99 for pi0/pi05) replaces the schedule (it is both clamps), so it
    cannot be combined with changed ``min_decay``/``max_decay``.
    """

    enable: bool = field(
        default=False,
        validator=_bool("ema.enable"),
        metadata={
            "help": "Keep an EMA shadow of the trainable weights (one more fp32 copy of "
            "them per rank: of its own shards under FSDP2/HSDP)."
        },
    )
    decay: float | None = field(
        default=None,
        validator=_number(
            "ema.decay",
            "a number in [0, 1], or null for the warmup schedule",
            lambda v: 0 <= v <= 1,
            optional=True,
        ),
        metadata={"help": "Constant decay at every update (openpi: 0.99); null: the warmup schedule."},
    )
    update_after_step: int = field(
        default=0,
        validator=_number("ema.update_after_step", "an integer ≥ 0", lambda v: isinstance(v, int) and v >= 0),
        metadata={"help": "Optimizer updates during which the shadow stays a copy of the live weights."},
    )
    inv_gamma: float = field(
        default=1.0,
        validator=_number("ema.inv_gamma", "a number > 0", lambda v: v > 0),
        metadata={"help": "Warmup schedule: 1 - (1 + t/inv_gamma)^-power."},
    )
    power: float = field(
        default=0.75,
        validator=_number("ema.power", "a number > 0", lambda v: v > 0),
        metadata={"help": "Warmup schedule exponent."},
    )
    min_decay: float = field(
        default=0.0,
        validator=_number("ema.min_decay", "a number in [0, 1]", lambda v: 0 <= v <= 1),
        metadata={"help": "Lower clamp of the scheduled decay."},
    )
    max_decay: float = field(
        default=0.9999,
        validator=_number("ema.max_decay", "a number in [0, 1]", lambda v: 0 <= v <= 1),
        metadata={"help": "Upper clamp of the scheduled decay."},
    )
    use_for_eval: bool = field(
        default=True,
        validator=_bool("ema.use_for_eval"),
        metadata={"help": "Compute the held-out eval loss with the EMA weights."},
    )

    def __attrs_post_init__(self) -> None:
        if self.min_decay > self.max_decay:
            raise ValueError(
                f"ema.min_decay must be ≤ ema.max_decay, got min_decay={self.min_decay} and "
                f"max_decay={self.max_decay}"
            )
        if self.decay is not None and (self.min_decay, self.max_decay) != (0.0, 0.9999):
            raise ValueError(
                "ema.decay (a constant decay) excludes changed ema.min_decay and ema.max_decay (the "
                "schedule's clamps): set one or the other"
            )

    def decay_at(self, update: int) -> float:
        """The decay applied by the ``update``-th update (1-based), as diffusers' ``EMAModel.get_decay``."""
        t = max(0, update - self.update_after_step - 1)
        if t <= 0:
            return 0.0
        low, high = (self.decay, self.decay) if self.decay is not None else (self.min_decay, self.max_decay)
        return max(min(1 - (1 + t / self.inv_gamma) ** -self.power, high), low)
