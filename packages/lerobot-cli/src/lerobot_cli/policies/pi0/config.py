"""pi0 config: LeRobot 0.6.1's ``PI0Config`` field for field, torch-free.

Every field is :class:`~lerobot_cli.policies.common.paligemma.config.PiFlowConfig`'s (pi05 shares them,
with three other defaults); this module names pi0's policy class and processor steps.
"""

from __future__ import annotations

from typing import ClassVar

from attrs import define

from lerobot_cli.policies.common.paligemma.config import PiFlowConfig, paligemma_spec
from lerobot_cli.policies.spec import PolicySpec

PI_SPEC = paligemma_spec(
    model="lerobot_cli.policies.pi0.modeling:PI0Policy",
    processors="lerobot_cli.policies.pi0.processors:pi0_processor_steps",
)


@define(frozen=True, kw_only=True)
class PI0Config(PiFlowConfig):
    type: ClassVar[str] = "pi0"
    spec: ClassVar[PolicySpec] = PI_SPEC
