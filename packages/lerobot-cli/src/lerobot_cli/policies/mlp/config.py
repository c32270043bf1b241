"""A small behaviour-cloning MLP: the smallest real policy, for smoke tests and examples."""

from __future__ import annotations

from typing import ClassVar

from attrs import define, field

from lerobot_cli.optim.config import OptimizerConfig
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.spec import PolicySpec


@define(frozen=True, kw_only=True)
class MLPConfig(PolicyConfig):
    type: ClassVar[str] = "mlp"
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="lerobot_cli.policies.mlp.modeling:MLPPolicy",
        wrap_units=("MLPBlock",),
        peft_targets=r"blocks\.\d+\.linear",  # default --peft.target_modules (regex)
    )

    hidden_dim: int = field(default=64, metadata={"help": "Width of each hidden block."})
    n_blocks: int = field(default=2, metadata={"help": "Number of MLPBlock layers (FSDP wrap units)."})
    dropout: float = field(default=0.0, metadata={"help": "Dropout inside blocks."})
    optimizer_lr: float = field(default=1e-3, metadata={"help": "Preset learning rate."})
    optimizer_weight_decay: float = field(default=0.0, metadata={"help": "Preset weight decay."})
    grad_clip_norm: float = field(default=10.0, metadata={"help": "Preset gradient clipping norm."})

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.hidden_dim < 1 or self.n_blocks < 1:
            raise ValueError("--policy.hidden_dim and --policy.n_blocks must be ≥ 1")

    def optimizer_preset(self) -> OptimizerConfig:
        return OptimizerConfig(
            type="adamw",
            lr=self.optimizer_lr,
            weight_decay=self.optimizer_weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )
