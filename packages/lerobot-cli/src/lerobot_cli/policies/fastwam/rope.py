"""Position and time encodings of FastWAM's two DiTs, in Wan2.2's arithmetic.

Rotary tables are complex128 angles ``exp(i·p·θ^(-2j/d))`` for positions ``p < 1024``: one table over the
whole head for the action DiT's 1-D token positions, and for the video DiT three tables side by side (frame,
row, column; the head's channel pairs split ``c - 2⌊c/3⌋, ⌊c/3⌋, ⌊c/3⌋``). They are computed on the host in
float64, as Wan computes them, and copied to the device that asks, so every device sees the same bits.

They are not module state: not in the state dict (LeRobot's checkpoints have none), and not buffers, which
``module.to(torch.bfloat16)`` would cast (a complex table cast to bf16 loses its imaginary part). A
:class:`RopeTables` holds them lazily per device, so a model built on the meta device and materialised
later computes real tables at its first forward; nothing is left to re-initialise.

Rotation multiplies ``q``/``k`` channel pairs, read as complex numbers, by the table in complex128 (an fp32 or
bf16 input is widened exactly): the video DiT returns float32 (Wan's ``rope_apply``), the action DiT its input
dtype. The sinusoidal embedding of timesteps and action positions is float64 ``[cos, sin]`` as in Wan.
"""

from __future__ import annotations

import torch
from torch import Tensor

MAX_POSITIONS = 1024  # Wan's table length: positions (frames, rows, columns, action steps) below it
THETA = 10000.0


def sinusoidal_embedding(dim: int, positions: Tensor) -> Tensor:
    """``(N, dim)`` float64 ``[cos(p·ω_j), sin(p·ω_j)]``, ``ω_j = 10000^(-j/(dim/2))``, on ``positions``'
    device."""
    if dim % 2:
        raise ValueError(f"a sinusoidal embedding needs an even width, got {dim}")
    half = dim // 2
    positions = positions.to(torch.float64)
    exponents = torch.arange(half, device=positions.device).to(positions).div(half)
    angles = torch.outer(positions, torch.pow(THETA, -exponents))
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


def rotary_angles(pairs_width: int, max_positions: int = MAX_POSITIONS) -> Tensor:
    """``(max_positions, pairs_width // 2)`` complex128 unit phasors, computed on the host."""
    if pairs_width % 2:
        raise ValueError(f"a rotary table needs an even width, got {pairs_width}")
    channels = torch.arange(0, pairs_width, 2, device="cpu").to(torch.float64)
    inv = 1.0 / torch.pow(THETA, channels.div(pairs_width))
    angles = torch.outer(torch.arange(max_positions, device="cpu"), inv)
    return torch.polar(torch.ones_like(angles), angles)


def video_axis_widths(head_dim: int) -> tuple[int, int, int]:
    """Channel widths given to frame, row and column rotation (Wan: the rows and columns get 2⌊d/6⌋ each)."""
    sixth = head_dim // 6
    return head_dim - 4 * sixth, 2 * sixth, 2 * sixth


def video_rotary_table(head_dim: int) -> Tensor:
    """``(1024, head_dim // 2)``: the frame, row and column tables side by side."""
    return torch.cat([rotary_angles(width) for width in video_axis_widths(head_dim)], dim=1)


def video_token_phasors(table: Tensor, frames: int, height: int, width: int) -> Tensor:
    """``(frames·height·width, 1, c)`` phasors of the tokens of a ``frames × height × width`` latent grid,
    tokens in frame-major order (the order the patch embedding flattens them in)."""
    c = table.shape[1]
    axis_f, axis_h, axis_w = table.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    grid = (frames, height, width)
    per_token = torch.cat(
        [
            axis_f[:frames].view(frames, 1, 1, -1).expand(*grid, -1),
            axis_h[:height].view(1, height, 1, -1).expand(*grid, -1),
            axis_w[:width].view(1, 1, width, -1).expand(*grid, -1),
        ],
        dim=-1,
    )
    return per_token.reshape(frames * height * width, 1, -1)


def action_token_phasors(table: Tensor, length: int) -> Tensor:
    """``(length, 1, c)`` phasors of action steps ``0 … length-1``."""
    if length > table.shape[0]:
        raise ValueError(
            f"action token length {length} exceeds the rotary table ({table.shape[0]} positions)"
        )
    return table[:length].view(length, 1, -1)


def rotate(x: Tensor, phasors: Tensor, num_heads: int, out_dtype: torch.dtype | None) -> Tensor:
    """``x`` ``(B, S, heads·d)`` with each channel pair turned by its token's phasor (complex128 product).

    ``out_dtype``: float32 for the video DiT (Wan's rope returns fp32), None to keep ``x``'s dtype (action
    DiT)."""
    b, s = x.shape[:2]
    wide = x.reshape(b, s, num_heads, -1).to(torch.float64)
    pairs = torch.view_as_complex(wide.reshape(b, s, num_heads, -1, 2))
    turned = torch.view_as_real(pairs * phasors).flatten(2)
    return turned.to(x.dtype if out_dtype is None else out_dtype)


class RopeTables:
    """One DiT's rotary table, built on the host at first use and copied once to each device that asks.

    Plain Python state (see the module docstring): survives meta-device construction, ``to_empty`` and
    dtype casts untouched, and ``copy.deepcopy`` (an EMA shadow) gets its own."""

    def __init__(self, head_dim: int, video: bool) -> None:
        self.head_dim, self.video = head_dim, video
        self._host: Tensor | None = None
        self._on: dict[torch.device, Tensor] = {}

    def host(self) -> Tensor:
        if self._host is None:
            self._host = video_rotary_table(self.head_dim) if self.video else rotary_angles(self.head_dim)
        return self._host

    def on(self, device: torch.device) -> Tensor:
        device = torch.device(device)
        if device.type == "cpu":
            return self.host()
        if device not in self._on:
            self._on[device] = self.host().to(device)
        return self._on[device]

    def clear(self) -> None:
        """Forget every copy (they are rebuilt at the next use)."""
        self._host, self._on = None, {}
