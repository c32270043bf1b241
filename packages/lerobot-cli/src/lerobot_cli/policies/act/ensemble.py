"""Temporal ensembling of overlapping action chunks (ACT paper, Algorithm 2).

Querying the policy at every step yields up to ``chunk_size`` predictions for each future step. They are
averaged with weights ``w_i = exp(-coeff · i)``, ``i = 0`` being the oldest prediction, so a positive
coefficient trusts older predictions more (the paper uses 0.01). The average is kept online: each step
folds the new chunk into the running means, then emits and drops the first one.
"""

from __future__ import annotations

import torch
from torch import Tensor


class ACTTemporalEnsembler:
    def __init__(self, temporal_ensemble_coeff: float, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.weights = torch.exp(-temporal_ensemble_coeff * torch.arange(chunk_size, dtype=torch.float64))
        self.cumulative = self.weights.cumsum(0)
        self.reset()

    def reset(self) -> None:
        """Forget all pending predictions (call at episode start)."""
        self._mean: Tensor | None = None  # (B, L, A) running weighted means for the next L steps
        self._count: Tensor | None = None  # (L,) how many predictions each mean already holds

    def update(self, actions: Tensor) -> Tensor:
        """Fold in a ``(B, chunk_size, A)`` prediction and return the ``(B, A)`` action for this step."""
        weights = self.weights.to(actions.device, actions.dtype)
        cumulative = self.cumulative.to(actions.device, actions.dtype)
        if self._mean is None:
            mean = actions.clone()
            count = torch.ones(self.chunk_size, dtype=torch.long, device=actions.device)
        else:
            held = self._count  # predictions so far for steps 0 … L-1 of the new chunk
            w_old = cumulative[held - 1][None, :, None]
            w_new = weights[held][None, :, None]
            w_all = cumulative[held][None, :, None]
            overlap = (self._mean * w_old + actions[:, :-1] * w_new) / w_all
            mean = torch.cat([overlap, actions[:, -1:]], dim=1)
            count = torch.cat([torch.clamp(held + 1, max=self.chunk_size), held.new_ones(1)])
        self._mean, self._count = mean[:, 1:], count[1:]
        return mean[:, 0]
