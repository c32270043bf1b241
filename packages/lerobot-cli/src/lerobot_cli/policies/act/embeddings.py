"""Fixed sinusoidal position embeddings used by ACT (1-D for the VAE encoder, 2-D for camera maps).

Both reproduce LeRobot's numbers exactly (positions, frequencies and the sin/cos interleaving), since a
checkpoint's learned weights were trained against these embeddings and are not portable otherwise.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_embedding_1d(num_positions: int, dimension: int) -> Tensor:
    """``(num_positions, dimension)`` table: sin on even channels, cos on odd, paired frequencies."""
    # Computed in float64 and rounded once, as the original numpy table was.
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]
    channel = torch.arange(dimension, dtype=torch.float64)
    angles = positions / torch.pow(10000.0, 2 * torch.div(channel, 2, rounding_mode="floor") / dimension)
    table = torch.empty_like(angles)
    table[:, 0::2] = angles[:, 0::2].sin()
    table[:, 1::2] = angles[:, 1::2].cos()
    return table.float()


def _interleave_sin_cos(angles: Tensor) -> Tensor:
    """(..., d) angles -> (..., d) as [sin a0, cos a1, sin a2, cos a3, ...]."""
    return torch.stack((angles[..., 0::2].sin(), angles[..., 1::2].cos()), dim=-1).flatten(-2)


class ACTSinusoidalPositionEmbedding2d(nn.Module):
    """2-D embedding of a ``(B, C, H, W)`` feature map: ``dimension`` channels for y, then for x.

    Row and column indices run 1..H and 1..W and are scaled to (0, 2π]; the output is
    ``(1, 2 * dimension, H, W)`` and carries no parameters.
    """

    def __init__(self, dimension: int, temperature: float = 10000.0, eps: float = 1e-6) -> None:
        super().__init__()
        self.dimension = dimension
        self.temperature = temperature
        self.eps = eps

    def _axis(self, length: int, device: torch.device) -> Tensor:
        index = torch.arange(1, length + 1, dtype=torch.float32, device=device)
        index = index / (length + self.eps) * (2 * math.pi)
        channel = torch.arange(self.dimension, dtype=torch.float32, device=device)
        inverse_frequency = self.temperature ** (
            2 * torch.div(channel, 2, rounding_mode="floor") / self.dimension
        )
        return _interleave_sin_cos(index[:, None] / inverse_frequency)  # (length, dimension)

    def forward(self, feature_map: Tensor) -> Tensor:
        height, width = feature_map.shape[-2:]
        y = self._axis(height, feature_map.device)[:, None, :].expand(height, width, self.dimension)
        x = self._axis(width, feature_map.device)[None, :, :].expand(height, width, self.dimension)
        return torch.cat((y, x), dim=-1).permute(2, 0, 1).unsqueeze(0)
