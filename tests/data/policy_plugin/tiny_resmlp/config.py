"""The plugin's config and contract: torch-free, as lerobot-cli parses it before torch loads."""

from __future__ import annotations

from typing import ClassVar

from attrs import define
from lerobot_cli.optim.config import OptimizerConfig
from lerobot_cli.policies import PolicyConfig, PolicySpec


@define(frozen=True, kw_only=True)
class TinyResMLPConfig(PolicyConfig):
    type: ClassVar[str] = "tiny_resmlp"
    # The model class declares nothing for FSDP: its units can only come from here.
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="tiny_resmlp.modeling:TinyResMLPPolicy",
        wrap_units=("ResidualUnit",),
        peft_targets=r"units\.\d+\.fc",
    )

    width: int = 16
    depth: int = 3
    # tests only: a directory where each rank appends the ``index`` of every training sample it gets
    # (tests/test_streaming_train.py checks which frames an epoch read)
    record_dir: str | None = None

    def optimizer_preset(self) -> OptimizerConfig:
        return OptimizerConfig(type="adamw", lr=1e-2, weight_decay=0.0)
