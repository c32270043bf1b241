"""pi05's processor step lists, in LeRobot 0.6.1's order (``processor_pi05.py``); see
``lerobot_cli.policies.pi0.processors`` for the order of both policies, and
``lerobot_cli.policies.common.paligemma.processors`` for the steps they build alike."""

from __future__ import annotations

from lerobot_cli.policies.common.paligemma.config import PiFlowConfig
from lerobot_cli.policies.common.paligemma.processors import paligemma_tokenizer_step, relative_actions_steps
from lerobot_cli.policies.pi05.prompts import Pi05StateTokensStep
from lerobot_cli.processors.factory import DefaultSteps, StepLists


def pi05_processor_steps(config: PiFlowConfig, defaults: DefaultSteps) -> StepLists:
    relative, absolute = relative_actions_steps(config)
    pre = [
        defaults.rename_observations,
        defaults.add_batch_dim,
        relative,
        defaults.normalize,
        Pi05StateTokensStep(max_state_dim=config.max_state_dim),
        paligemma_tokenizer_step(config),
        defaults.to_device,
    ]
    return pre, [defaults.unnormalize, absolute, defaults.to_cpu]
