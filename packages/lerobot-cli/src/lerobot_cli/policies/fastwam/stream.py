"""``ExpertInput``: what one expert hands each MoT layer — its tokens and the per-forward constants.

An expert's embedding step (``VideoDiT.embed`` / ``ActionDiT.embed``) produces it once per forward; the layers
replace ``tokens`` layer by layer and read the rest unchanged. Only tensors and a dtype, so FSDP's input casts
and activation checkpointing pass it through as they pass a tuple.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class ExpertInput:
    """``tokens`` ``(B, S, D)``; ``t_mod`` the time projection (``(B, 6, D)`` or per token ``(B, S, 6, D)``);
    ``phasors`` ``(S, 1, head_dim/2)`` complex128 rotary phasors of the tokens; ``rope_dtype`` the dtype
    rotated q/k come out in (None: the tokens'); ``context`` ``(B, L, D)`` and ``context_mask`` ``(B, S, L)``
    bool for the cross-attention (None: no cross-attention)."""

    tokens: Tensor
    t_mod: Tensor
    phasors: Tensor
    rope_dtype: torch.dtype | None
    context: Tensor | None
    context_mask: Tensor | None

    def with_tokens(self, tokens: Tensor) -> ExpertInput:
        return dataclasses.replace(self, tokens=tokens)
