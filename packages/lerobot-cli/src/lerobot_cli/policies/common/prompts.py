"""The task-text newline rule pi0 and SmolVLA share: every task ends with ``"\\n"``, the prompt
terminator their tokenizers were trained with (the text is otherwise unchanged).

``NewLineTaskStep`` is not registered itself: LeRobot saves the rule under a name per policy
(``pi0_new_line_processor``, ``smolvla_new_line_processor``), and each policy registers a subclass with its
own ``registry_name`` so that saved ``policy_preprocessor.json`` files keep LeRobot's names both ways.
"""

from __future__ import annotations

from lerobot_cli.processors.steps import Batch, ProcessorStep


class NewLineTaskStep(ProcessorStep):
    """Append ``"\\n"`` to each task string that lacks one; anything that is not text passes unchanged."""

    def __call__(self, batch: Batch) -> Batch:
        task = batch.get("task")
        if isinstance(task, str):
            return {**batch, "task": task if task.endswith("\n") else f"{task}\n"}
        if isinstance(task, list) and all(isinstance(t, str) for t in task):
            return {**batch, "task": [t if t.endswith("\n") else f"{t}\n" for t in task]}
        return batch
