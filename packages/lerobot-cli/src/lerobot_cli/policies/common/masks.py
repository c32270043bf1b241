"""big_vision's block attention masks (``mask_ar``), as pi0, pi05 and SmolVLA build them.

Each token carries a block-start mark; token q may attend to token k when k's block (the cumulative sum
of the marks) started no later than q's, and both are real tokens. Prefix tokens (images, language) share
one bidirectional block; each later block sees everything before it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def attention_mask_2d(pad_masks: Tensor, block_starts: Tensor) -> Tensor:
    """``(B, T, T)`` may-attend mask from ``(B, T)`` padding (True = real token) and block-start marks."""
    blocks = torch.cumsum(block_starts, dim=1)
    causal = blocks[:, None, :] <= blocks[:, :, None]
    return causal & (pad_masks[:, None, :] & pad_masks[:, :, None])
