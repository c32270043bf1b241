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


def _upper(value):
    return value.upper() if isinstance(value, str) else value


@define(frozen=True)
class PeftConfig:
    """``target_modules=None`` means the policy's own default (ACT: transformer projections)."""

    method_type: str = field(
        default="LORA", converter=_upper, metadata={"help": "PEFT method.", "choices": PEFT_METHODS}
    )
    r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int | None = field(default=None, metadata={"help": "LoRA scaling alpha (default: r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA path."})
    target_modules: tuple[str, ...] | None = field(
        default=None,
        converter=_tuple_or_none,
        metadata={
            "help": "Module names/regex to adapt (default: the policy's, ACT: transformer projections)."
        },
    )
    full_training_modules: tuple[str, ...] | None = field(
        default=None,
        converter=_tuple_or_none,
        metadata={"help": "Modules trained fully beside the adapters."},
    )
    init_type: str | None = field(
        default=None, metadata={"help": "peft init_lora_weights value (default: peft's)."}
    )

    def __attrs_post_init__(self) -> None:
        if self.method_type not in PEFT_METHODS:
            raise ValueError(
                f"--peft.method_type: invalid choice {self.method_type!r} (choose from "
                f"{', '.join(PEFT_METHODS)})"
            )
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"--peft.r must be an integer ≥ 1, got {self.r!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"--peft.lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
