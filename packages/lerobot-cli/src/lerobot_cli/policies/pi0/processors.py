"""pi0's processor step lists, in LeRobot 0.6.1's order (``processor_pi0.py``), and the steps pi05's share.

pi0's spec names ``pi0_processor_steps``, pi05's
``lerobot_cli.policies.pi05.processors:pi05_processor_steps``: each policy's pipelines and its own
steps live in its folder (``prompts.py``: pi0's newline step, pi05's state-in-prompt step); the generic
steps (tokenizer, relative actions) stay in ``lerobot_cli.processors``. Importing this module registers
the steps it uses, which is how a saved pipeline finds them (see ``lerobot_cli.processors.pipeline``).
Same steps at the same indices as LeRobot's, so the files agree down to the state-file names
(``policy_preprocessor_step_6_normalizer_processor.safetensors`` for pi0, ``step_3`` for pi05):

- pi0 pre:  rename → batch → newline → tokenizer → device → relative actions → normalizer
- pi05 pre: rename → batch → relative actions → normalizer → state-in-prompt → tokenizer → device
  (the state is discretised after normalisation, and the prompt it goes into is then tokenized)
- post (both): unnormalizer → absolute actions → device("cpu")

The tokenizer is ``config.tokenizer_name`` (LeRobot hard-codes PaliGemma's; our configs may name a local
directory) with ``config.tokenizer_max_length``, right padding to that length and truncation.
"""

from __future__ import annotations

from lerobot_cli.policies.pi0.config import PiFlowConfig
from lerobot_cli.policies.pi0.prompts import Pi0NewLineStep
from lerobot_cli.processors.factory import DefaultSteps, StepLists
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


def pi0_processor_steps(config: PiFlowConfig, defaults: DefaultSteps) -> StepLists:
    relative, absolute = relative_actions_steps(config)
    pre = [
        defaults.rename_observations,
        defaults.add_batch_dim,
        Pi0NewLineStep(),
        paligemma_tokenizer_step(config),
        defaults.to_device,
        relative,
        defaults.normalize,
    ]
    return pre, [defaults.unnormalize, absolute, defaults.to_cpu]
