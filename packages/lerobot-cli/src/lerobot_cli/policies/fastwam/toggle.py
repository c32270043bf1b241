"""FastWAM's action-toggle step: gripper-like dimensions turned into ±1 commands after unnormalisation.

``ActionToggleStep`` is LeRobot 0.6.1's ``fastwam_action_toggle_processor`` (same registry name and
config, so either side reads the other's ``policy_postprocessor.json``). FastWAM's LIBERO checkpoints
predict a gripper channel in [0, 1] where LIBERO's controller wants -1 (open) or +1 (close), with the
opposite sign: each listed dimension ``a`` becomes ``sign(-(2a - 1))`` (so 0 at exactly 0.5). A negative
dimension counts from the end; one outside the action is refused when the step runs, as LeRobot does
(the step cannot know the action width before it sees one). The action is copied, never changed in place.

Registered under LeRobot's name when this module is imported: ``fastwam_processor_steps`` (this folder's
``processors.py``) imports it, and a saved pipeline naming the step gets it through
``lerobot_cli.processors.pipeline``, which imports each policy's ``PolicySpec.processors`` module when a
file names a step not yet registered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from lerobot_cli.processors.steps import Batch, ProcessorStep, register_step


@register_step
class ActionToggleStep(ProcessorStep):
    """Map each of ``toggle_dimensions`` of ``batch["action"]`` from [0, 1] to LIBERO's ∓1 gripper command."""

    registry_name: ClassVar[str] = "fastwam_action_toggle_processor"

    def __init__(self, toggle_dimensions: Sequence[int]) -> None:
        dims = list(toggle_dimensions)
        if any(isinstance(d, bool) or not isinstance(d, int) for d in dims):
            raise ValueError(f"{self.registry_name}: toggle_dimensions must be integers, got {dims!r}")
        self.toggle_dimensions = dims

    def __call__(self, batch: Batch) -> Batch:
        action = batch.get("action")
        if action is None:
            raise ValueError(f"{self.registry_name} needs an action in the batch")
        if not self.toggle_dimensions:
            return batch
        toggled = action.clone()
        width = int(toggled.shape[-1])
        for dim in self.toggle_dimensions:
            index = dim if dim >= 0 else width + dim
            if not 0 <= index < width:
                raise ValueError(
                    f"FastWAM action toggle dimension {dim} is out of bounds for action dim {width}."
                )
            toggled[..., index] = torch.sign(-(toggled[..., index] * 2.0 - 1.0))
        return {**batch, "action": toggled}

    def get_config(self) -> dict[str, Any]:
        return {"toggle_dimensions": list(self.toggle_dimensions)}
