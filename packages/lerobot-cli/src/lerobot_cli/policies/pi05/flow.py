"""pi05's flow-matching model: pi0's
(:class:`~lerobot_cli.policies.common.paligemma.flow.PI0FlowModel`) with two changes.

- No state token: the state is in the prompt (the pre-processor writes it there as 256-bin text), so
  the suffix is the ``chunk_size`` action tokens alone, one block that sees the prefix and itself.
- The flow time does not enter the action tokens. ``time_mlp_in`` → silu → ``time_mlp_out`` → silu maps
  its sine-cosine embedding to the condition of every adaptive RMSNorm in the expert (``dense`` in each
  layer's two norms and in the final norm: scale, shift and residual gate; see ``AdaRMSNorm``).

Everything else (prefix, masks, positions, training loss, cached-prefix Euler inference) is pi0's code.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.policies.common.paligemma.flow import PI0FlowModel, _as_input_of


class PI05FlowModel(PI0FlowModel):
    """The ``model`` of a pi05 policy (LeRobot's ``PI05Pytorch`` names: ``time_mlp_in``/``time_mlp_out``)."""

    uses_adarms = True

    def _build_time_path(self, width: int) -> None:
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)

    def embed_suffix(
        self, state: Tensor | None, noisy_actions: Tensor, time: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Action tokens (one block) and the time condition of the expert's norms; ``state`` is unused."""
        action_emb = self.action_in_proj(_as_input_of(self.action_in_proj, noisy_actions))
        time_emb = _as_input_of(self.time_mlp_in, self._time_embedding(time))
        cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time_emb))))
        return action_emb, *self._suffix_masks(action_emb, with_state=False), cond
