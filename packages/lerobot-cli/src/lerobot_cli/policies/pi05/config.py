"""pi05 config: LeRobot 0.6.1's ``PI05Config`` field for field, torch-free.

LeRobot's ``PI05Config`` is its ``PI0Config`` with three defaults changed, so it is ``PiFlowConfig``
(the fields both share, see :mod:`lerobot_cli.policies.common.paligemma.config`) with those three:
the robot state and the actions are normalised with ``QUANTILES`` (q01/q99 of the dataset, so a few
outliers do not squeeze the bulk of the data into a small range), and the prompt may be 200 tokens long
because the discretised state travels in it (``pi05_prepare_state_tokenizer_processor_step``).
"""

from __future__ import annotations

from typing import ClassVar

from attrs import define, field

from lerobot_cli.features import NormalizationMode, normalization_mapping
from lerobot_cli.policies.common.paligemma.config import PiFlowConfig, paligemma_spec
from lerobot_cli.policies.spec import PolicySpec


def _pi05_normalization() -> dict[str, NormalizationMode]:
    return normalization_mapping(
        NormalizationMode.IDENTITY, NormalizationMode.QUANTILES, NormalizationMode.QUANTILES
    )


@define(frozen=True, kw_only=True)
class PI05Config(PiFlowConfig):
    type: ClassVar[str] = "pi05"
    # LeRobot 0.6.1's _get_default_peft_targets for pi05 is pi0's regex verbatim (inherited): its names
    # state_proj and action_time_mlp_* match no pi05 module, so time_mlp_in/out are not adapted,
    # as in LeRobot.
    spec: ClassVar[PolicySpec] = paligemma_spec(
        model="lerobot_cli.policies.pi05.modeling:PI05Policy",
        processors="lerobot_cli.policies.pi05.processors:pi05_processor_steps",
    )

    normalization_mapping: dict[str, NormalizationMode] = field(factory=_pi05_normalization)
    tokenizer_max_length: int = 200
