"""Tensor padding the VLA policies share (openpi/LeRobot keep states and actions at ``max_*_dim``)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def pad_last_dim(x: Tensor, size: int) -> Tensor:
    """Zero-pad the last dimension to ``size``; a wider one is kept as is (LeRobot's ``pad_vector``)."""
    return x if x.shape[-1] >= size else F.pad(x, (0, size - x.shape[-1]))
