"""pi0's task-text step: the prompt the PaliGemma tokenizer sees, built as LeRobot builds it.

``Pi0NewLineStep`` (``pi0_new_line_processor``): every task ends with ``"\\n"``, PaliGemma's prompt
terminator (the text is otherwise unchanged).

Registered under LeRobot's name when this module is imported: ``pi0_processor_steps`` (this folder's
``processors.py``, which the spec names) imports it, and a saved pipeline naming the step gets it
through ``lerobot_cli.processors.pipeline``, which imports each policy's ``PolicySpec.processors`` module
when a file names a step not yet registered.
"""

from __future__ import annotations

from typing import ClassVar

from lerobot_cli.processors.steps import Batch, ProcessorStep, register_step


@register_step
class Pi0NewLineStep(ProcessorStep):
    """Append ``"\\n"`` to each task string that lacks one; anything that is not text passes unchanged."""

    registry_name: ClassVar[str] = "pi0_new_line_processor"

    def __call__(self, batch: Batch) -> Batch:
        task = batch.get("task")
        if isinstance(task, str):
            return {**batch, "task": task if task.endswith("\n") else f"{task}\n"}
        if isinstance(task, list) and all(isinstance(t, str) for t in task):
            return {**batch, "task": [t if t.endswith("\n") else f"{t}\n" for t in task]}
        return batch
