"""pi0's processor step lists, in LeRobot 0.6.1's order (``processor_pi0.py``).

pi0's spec names ``pi0_processor_steps``, pi05's
``lerobot_cli.policies.pi05.processors:pi05_processor_steps``: each policy's pipelines and its own
steps live in its folder (``prompts.py``: pi0's newline step, pi05's state-in-prompt step); the generic
steps (tokenizer, relative actions) stay in ``lerobot_cli.processors``, built from the config alike for both
policies in ``lerobot_cli.policies.common.paligemma.processors``. Importing this module registers
the steps it uses, which is how a saved pipeline finds them (see ``lerobot_cli.processors.pipeline``).
Same steps at the same indices as LeRobot's, so the files agree down to the state-file names
(``policy_preprocessor_step_6_normalizer_processor.safetensors`` for pi0, ``step_3`` for pi05):

- pi0 pre:  rename → batch → newline → tokenizer → device → relative actions → normalizer
- pi05 pre: rename → batch → relative actions → normalizer → state-in-prompt → tokenizer → device
  (the state is discretised after normalisation, and the prompt it goes into is then tokenized)
- post (both): unnormalizer → absolute actions → device("cpu")
"""

from __future__ import annotations

from lerobot_cli.policies.common.paligemma.config import PiFlowConfig
from lerobot_cli.policies.common.paligemma.processors import paligemma_tokenizer_step, relative_actions_steps
from lerobot_cli.policies.pi0.prompts import Pi0NewLineStep
from lerobot_cli.processors.factory import DefaultSteps, StepLists


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
