"""LoRA-style adapter settings passed to the ``peft`` library (torch-free)."""

from __future__ import annotations

from attrs import define, field

PEFT_METHODS = ("LORA",)


def _tuple_or_none(value):
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(value)


@define(frozen=True)
class PeftConfig:
    """``target_modules=None`` means the policy's own default (ACT: transformer projections)."""

    method_type: str = field(default="LORA", converter=lambda v: v.upper() if isinstance(v, str) else v)
    r: int = 16
    lora_alpha: int | None = None
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] | None = field(default=None, converter=_tuple_or_none)
    full_training_modules: tuple[str, ...] | None = field(default=None, converter=_tuple_or_none)
    init_type: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.method_type not in PEFT_METHODS:
            raise ValueError(f"--peft.method_type: invalid choice {self.method_type!r} (choose from {', '.join(PEFT_METHODS)})")
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"--peft.r must be an integer ≥ 1, got {self.r!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"--peft.lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
