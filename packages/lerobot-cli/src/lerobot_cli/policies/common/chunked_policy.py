"""``ChunkedFlowPolicy``: the inference and input plumbing pi0, pi05 and SmolVLA share.

Each predicts a chunk of ``chunk_size`` normalised actions from cameras, the tokenised task and the state,
and serves them one step at a time from a queue of ``n_action_steps`` (LeRobot's ``select_action``). A
subclass builds ``self.model`` (whose ``sample_actions(images, image_masks, tokens, token_masks, state,
noise)`` integrates the flow) and says how it reads cameras (``_images``) and the state (``_state``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lerobot_cli.policies.common.flow_matching import draw_noise_and_time

ACTION = "action"
OBS_STATE = "observation.state"
LANGUAGE_TOKENS = "observation.language.tokens"
LANGUAGE_MASK = "observation.language.attention_mask"


class ChunkedFlowPolicy(nn.Module):
    """Base of the VLA flow policies: action queue, language inputs and chunk inference."""

    name: ClassVar[str]

    def get_optim_params(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def reset(self) -> None:
        """Drop queued actions; call when an episode starts."""
        self._action_queue: deque[Tensor] = deque(maxlen=self.config.n_action_steps)

    # -- inputs -----------------------------------------------------------------------------------
    def _images(self, batch: dict[str, Any]) -> tuple[list[Tensor], list[Tensor]]:
        raise NotImplementedError

    def _state(self, batch: dict[str, Any]) -> Tensor | None:
        raise NotImplementedError

    def _language(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        if LANGUAGE_TOKENS not in batch:
            raise KeyError(
                f"{self.name} needs the tokenised task ({LANGUAGE_TOKENS}); run the batch through the "
                "policy's pre-processor first"
            )
        return batch[LANGUAGE_TOKENS], batch[LANGUAGE_MASK].to(torch.bool)

    def _action_dim(self) -> int:
        return self.config.action_feature.shape[-1]

    def _draw_noise_and_time(self, batch: dict[str, Any], actions: Tensor) -> tuple[Tensor, Tensor]:
        """Each sample's flow noise and time, keyed by its dataset ``index`` when the batch has one
        (see :func:`~lerobot_cli.policies.common.flow_matching.draw_noise_and_time`)."""
        return draw_noise_and_time(batch, actions, self.model.sample_noise, self.model.sample_time)

    # -- inference --------------------------------------------------------------------------------
    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Any], noise: Tensor | None = None) -> Tensor:
        """``(B, chunk_size, action_dim)`` normalised actions; puts the policy in eval mode."""
        self.eval()
        images, image_masks = self._images(batch)
        tokens, token_masks = self._language(batch)
        actions = self.model.sample_actions(
            images, image_masks, tokens, token_masks, self._state(batch), noise
        )
        return actions[:, :, : self._action_dim()]

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any], noise: Tensor | None = None) -> Tensor:
        """The ``(B, A)`` action for this step, from the queue refilled with ``n_action_steps`` of a new
        chunk when empty."""
        self.eval()
        if not self._action_queue:
            chunk = self.predict_action_chunk(batch, noise)[:, : self.config.n_action_steps]
            self._action_queue.extend(chunk.transpose(0, 1))
        return self._action_queue.popleft()
