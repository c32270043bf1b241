"""pi05's task-text step: the prompt the PaliGemma tokenizer sees, built as LeRobot builds it.

``Pi05StateTokensStep`` (``pi05_prepare_state_tokenizer_processor_step``): pi05 reads the robot state as
text. The already normalised state (in [-1, 1]) is cut into 256 bins, openpi's discretisation, and each
task becomes ``"Task: <task>, State: <bin> <bin> …;\\nAction: "``. It must run after the normalizer and
before the tokenizer.

Registered under LeRobot's name when this module is imported: ``pi05_processor_steps`` (this folder's
``processors.py``, which the spec names) imports it, and a saved pipeline naming the step gets it
through ``lerobot_cli.processors.pipeline``, which imports each policy's ``PolicySpec.processors`` module
when a file names a step not yet registered.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from lerobot_cli.processors.steps import Batch, ProcessorStep, register_step

STATE = "observation.state"
STATE_BINS = 256
# Left edges of the 256 equal bins of [-1, 1]; np.digitize(x, edges) - 1 is the bin, -1 below -1 and
# 255 from the last edge up (values above 1 included), exactly LeRobot's and openpi's numbers.
_BIN_EDGES = np.linspace(-1, 1, STATE_BINS + 1)[:-1]
_PI05_DEFAULTS = {"max_state_dim": 32, "task_key": "task"}


def discretize_state(state: torch.Tensor) -> np.ndarray:
    """``(B, S)`` normalised state → ``(B, S)`` integer bins (openpi's ``PaligemmaTokenizer`` rule)."""
    state = state.detach().cpu()
    if state.dtype not in (torch.float32, torch.float64):
        state = state.float()  # bf16/fp16 hold no value a float32 cannot: the bins are unchanged
    return np.digitize(state.numpy(), bins=_BIN_EDGES) - 1


def pi05_prompt(task: str, bins: Any) -> str:
    """One pi05 prompt. The task is stripped and its underscores and newlines become spaces."""
    text = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {text}, State: {' '.join(str(int(b)) for b in bins)};\nAction: "


@register_step
class Pi05StateTokensStep(ProcessorStep):
    """Rewrite ``batch[task_key]`` into pi05 prompts that carry the discretised ``observation.state``.

    ``max_state_dim`` is kept for LeRobot's config (the prompt holds the state's own dimensions).
    LeRobot 0.6.1 saves this step with an empty config (its defaults); we save only the fields that
    differ from those defaults, so a default step writes LeRobot's file and any other still loads there.
    """

    registry_name: ClassVar[str] = "pi05_prepare_state_tokenizer_processor_step"

    def __init__(
        self, max_state_dim: int = _PI05_DEFAULTS["max_state_dim"], task_key: str = _PI05_DEFAULTS["task_key"]
    ) -> None:
        self.max_state_dim = max_state_dim
        self.task_key = task_key

    def __call__(self, batch: Batch) -> Batch:
        state = batch.get(STATE)
        if state is None:
            raise ValueError(
                f"{self.registry_name}: pi05 needs {STATE!r} in the batch (its prompt carries the state)"
            )
        tasks = batch.get(self.task_key)
        if tasks is None:
            raise ValueError(f"{self.registry_name}: the batch has no {self.task_key!r} text")
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        if state.dim() != 2 or state.shape[0] != len(tasks):
            raise ValueError(
                f"{self.registry_name}: {STATE!r} must be (batch, dims) with one row per task, "
                f"got shape {tuple(state.shape)} for {len(tasks)} task(s)"
            )
        bins = discretize_state(state)
        return {
            **batch,
            self.task_key: [pi05_prompt(task, row) for task, row in zip(tasks, bins, strict=True)],
        }

    def get_config(self) -> dict[str, Any]:
        config = {"max_state_dim": self.max_state_dim, "task_key": self.task_key}
        return {k: v for k, v in config.items() if v != _PI05_DEFAULTS[k]}
