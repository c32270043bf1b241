"""The processor steps pi0 and pi05 build alike from their config (LeRobot 0.6.1's ``processor_pi0.py``
and ``processor_pi05.py`` build them the same way); each policy's ``processors.py`` orders them.

The tokenizer is ``config.tokenizer_name`` (LeRobot hard-codes PaliGemma's; our configs may name a local
directory) with ``config.tokenizer_max_length``, right padding to that length and truncation.
"""

from __future__ import annotations

from lerobot_cli.policies.common.paligemma.config import PiFlowConfig
from lerobot_cli.processors.relative import AbsoluteActionsStep, RelativeActionsStep
from lerobot_cli.processors.tokenizer import TokenizerStep


def paligemma_tokenizer_step(config: PiFlowConfig) -> TokenizerStep:
    return TokenizerStep(
        tokenizer_name=config.tokenizer_name,
        max_length=config.tokenizer_max_length,
        padding_side="right",
        padding="max_length",
    )


def relative_actions_steps(config: PiFlowConfig) -> tuple[RelativeActionsStep, AbsoluteActionsStep]:
    """The paired relative/absolute steps, from LeRobot's config fields."""
    relative = RelativeActionsStep(
        enabled=config.use_relative_actions,
        exclude_joints=config.relative_exclude_joints,
        action_names=config.action_feature_names,
    )
    return relative, AbsoluteActionsStep(enabled=relative.enabled, relative_step=relative)
