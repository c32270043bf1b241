"""SmolVLA's processor step lists, in LeRobot 0.6.1's order (``processor_smolvla.py``).

- pre:  rename → batch → newline → tokenizer → device → normalizer (step 5:
  ``policy_preprocessor_step_5_normalizer_processor.safetensors``)
- post: unnormalizer → device("cpu")

The newline step is LeRobot's ``smolvla_new_line_processor`` (every task ends with ``"\\n"``). The tokenizer
is ``vlm_model_name``'s (a Hub id from the cache or a local directory), ``pad_language_to`` padding (LeRobot's
default ``longest``), right padding side, ``tokenizer_max_length`` with truncation. Importing this module
registers the newline step, which is how a saved pipeline finds it.
"""

from __future__ import annotations

from typing import ClassVar

from lerobot_cli.policies.common.prompts import NewLineTaskStep
from lerobot_cli.policies.smolvla.config import SmolVLAConfig
from lerobot_cli.processors.factory import DefaultSteps, StepLists
from lerobot_cli.processors.steps import register_step
from lerobot_cli.processors.tokenizer import TokenizerStep


@register_step
class SmolVLANewLineStep(NewLineTaskStep):
    """LeRobot's ``NewLineTaskProcessorStep``: the shared newline rule under the name SmolVLA's files use."""

    registry_name: ClassVar[str] = "smolvla_new_line_processor"


def smolvla_tokenizer_step(config: SmolVLAConfig) -> TokenizerStep:
    return TokenizerStep(
        tokenizer_name=config.vlm_model_name,
        max_length=config.tokenizer_max_length,
        padding_side="right",
        padding=config.pad_language_to,
    )


def smolvla_processor_steps(config: SmolVLAConfig, defaults: DefaultSteps) -> StepLists:
    pre = [
        defaults.rename_observations,
        defaults.add_batch_dim,
        SmolVLANewLineStep(),
        smolvla_tokenizer_step(config),
        defaults.to_device,
        defaults.normalize,
    ]
    return pre, [defaults.unnormalize, defaults.to_cpu]
