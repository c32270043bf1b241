"""pi0's task-text step: the prompt the PaliGemma tokenizer sees, built as LeRobot builds it.

``Pi0NewLineStep`` (``pi0_new_line_processor``): the shared newline rule
(:class:`~lerobot_cli.policies.common.prompts.NewLineTaskStep`) under the name pi0's files use.

Registered under LeRobot's name when this module is imported: ``pi0_processor_steps`` (this folder's
``processors.py``, which the spec names) imports it, and a saved pipeline naming the step gets it
through ``lerobot_cli.processors.pipeline``, which imports each policy's ``PolicySpec.processors`` module
when a file names a step not yet registered.
"""

from __future__ import annotations

from typing import ClassVar

from lerobot_cli.policies.common.prompts import NewLineTaskStep
from lerobot_cli.processors.steps import register_step


@register_step
class Pi0NewLineStep(NewLineTaskStep):
    """LeRobot's ``Pi0NewLineProcessor``: every task ends with ``"\\n"``."""

    registry_name: ClassVar[str] = "pi0_new_line_processor"
