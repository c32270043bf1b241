"""A small behaviour-cloning MLP: the smallest real policy, for smoke tests and examples."""

from __future__ import annotations

from typing import ClassVar

from attrs import define

from lerobot_cli.optim.config import OptimizerConfig
from lerobot_cli.policies.config import PolicyConfig


@define(frozen=True, kw_only=True)
class MLPConfig(PolicyConfig):
    type: ClassVar[str] = "mlp"
    policy_class: ClassVar[str] = "lerobot_cli.policies.mlp.modeling:MLPPolicy"

    hidden_dim: int = 64
    n_blocks: int = 2
    dropout: float = 0.0
    optimizer_lr: float = 1e-3
    optimizer_weight_decay: float = 0.0
    grad_clip_norm: float = 10.0

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.hidden_dim < 1 or self.n_blocks < 1:
            raise ValueError("--policy.hidden_dim and --policy.n_blocks must be ≥ 1")

    def optimizer_preset(self) -> OptimizerConfig:
        return OptimizerConfig(
            type="adamw", lr=self.optimizer_lr, weight_decay=self.optimizer_weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )
