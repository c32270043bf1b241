"""Relative actions (openpi's DeltaActions): train on ``action - state``, act on ``prediction + state``.

LeRobot 0.6.1 writes this pair into every pi0/pi05 pipeline, switched off by default
(``use_relative_actions=false``): ``relative_actions_processor`` in the pre-processor and
``absolute_actions_processor`` in the post-processor. They are here so our files list the same steps at the
same indices as LeRobot's, and so LeRobot's files load (an unknown step is refused).

On, the pre-processor step subtracts the raw ``observation.state`` from the action dimensions it converts
(all of them, except the joints whose names match ``exclude_joints``) and remembers that state; the paired
post-processor step adds the remembered state back to the policy's actions. Off, the pre-processor step
still remembers the state (LeRobot does too) and both leave the batch unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from lerobot_cli.processors.steps import Batch, ProcessorStep, register_step

STATE = "observation.state"


def _state_offset(actions: Tensor, state: Tensor, mask: Sequence[bool]) -> tuple[Tensor, int]:
    mask_t = torch.tensor(mask, dtype=actions.dtype, device=actions.device)
    state = state.to(device=actions.device, dtype=actions.dtype)
    offset = state[..., : mask_t.shape[0]] * mask_t
    return (offset.unsqueeze(-2) if actions.dim() == 3 else offset), mask_t.shape[0]


def to_relative_actions(actions: Tensor, state: Tensor, mask: Sequence[bool]) -> Tensor:
    """``actions`` ``(B, T, A)`` or ``(B, A)`` minus ``state`` ``(B, S)`` on the dimensions ``mask`` marks."""
    offset, dims = _state_offset(actions, state, mask)
    out = actions.clone()
    out[..., :dims] -= offset
    return out


def to_absolute_actions(actions: Tensor, state: Tensor, mask: Sequence[bool]) -> Tensor:
    """The inverse of ``to_relative_actions``."""
    offset, dims = _state_offset(actions, state, mask)
    out = actions.clone()
    out[..., :dims] += offset
    return out


@register_step
class RelativeActionsStep(ProcessorStep):
    """Pre-processor half: actions relative to the current state (when ``enabled``); caches the state."""

    registry_name: ClassVar[str] = "relative_actions_processor"

    def __init__(
        self,
        enabled: bool = False,
        exclude_joints: Sequence[str] | None = None,
        action_names: Sequence[str] | None = None,
    ) -> None:
        self.enabled = bool(enabled)
        self.exclude_joints = list(exclude_joints or [])
        self.action_names = None if action_names is None else list(action_names)
        self.last_state: Tensor | None = None

    def mask(self, action_dim: int) -> list[bool]:
        """Which action dimensions are converted: not those whose name contains an excluded joint name
        (case-insensitive); all of them when no names or no exclusions are known."""
        excluded = [str(name).lower() for name in self.exclude_joints if name]
        if not excluded or self.action_names is None:
            return [True] * action_dim
        mask = [
            not any(token in str(name).lower() for token in excluded)
            for name in self.action_names[:action_dim]
        ]
        return mask + [True] * (action_dim - len(mask))

    def __call__(self, batch: Batch) -> Batch:
        state = batch.get(STATE)
        if state is not None:
            self.last_state = state
        action = batch.get("action")
        if not self.enabled or action is None or state is None:
            return batch
        return {**batch, "action": to_relative_actions(action, state, self.mask(action.shape[-1]))}

    def get_config(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "exclude_joints": list(self.exclude_joints),
            "action_names": None if self.action_names is None else list(self.action_names),
        }


@register_step
class AbsoluteActionsStep(ProcessorStep):
    """Post-processor half: adds back the state its paired ``RelativeActionsStep`` saw (when ``enabled``).

    The pairing is not in the file: ``make_pre_post_processors`` and ``load_processors`` connect the two.
    """

    registry_name: ClassVar[str] = "absolute_actions_processor"

    def __init__(self, enabled: bool = False, relative_step: RelativeActionsStep | None = None) -> None:
        self.enabled = bool(enabled)
        self.relative_step = relative_step

    def __call__(self, batch: Batch) -> Batch:
        if not self.enabled or batch.get("action") is None:
            return batch
        if self.relative_step is None:
            raise RuntimeError(
                "absolute_actions_processor is enabled but has no paired relative_actions_processor; "
                "load the pre- and post-processor together (load_processors)"
            )
        state = self.relative_step.last_state
        if state is None:
            raise RuntimeError(
                "absolute_actions_processor needs the state of the last observation, but the "
                "pre-processor has not run yet; run it on the observation first"
            )
        action = batch["action"]
        return {
            **batch,
            "action": to_absolute_actions(action, state, self.relative_step.mask(action.shape[-1])),
        }

    def get_config(self) -> dict[str, Any]:
        return {"enabled": self.enabled}
