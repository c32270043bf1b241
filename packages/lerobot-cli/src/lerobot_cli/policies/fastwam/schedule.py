"""FastWAM's continuous flow-matching schedule (Wan2.2's shifted sigmas), one per expert.

Training draws ``u ~ U[0, 1)`` and warps it with the shift ``φ(u) = s·u / (1 + (s-1)·u)``: a shift above 1
pushes the noise level ``σ = φ(u)`` towards pure noise, where a video model has most to learn. The model
sees the timestep ``t = σ·N`` (N = ``num_train_timesteps``), the noisy sample ``(1-σ)·x + σ·ε`` and
regresses the velocity ``ε - x``. Each sample's loss is weighted by a bell curve in ``t`` centred on N/2,
shifted so the smallest weight on the shifted inference grid is 0 and scaled so the grid's mean weight is 1
(the statistics are computed once in float64, as Wan2.2 does, so every rank and every resume weighs
alike). Inference walks the shifted grid ``σ_k`` from 1 towards 0 with forward Euler steps
``x ← x + v·(σ_{k+1} - σ_k)``.

The arithmetic (dtypes included) is LeRobot 0.6.1's, so a seeded draw gives the same timesteps, weights
and targets bit for bit; ``rand`` is the only random call, so the draw order is the caller's.
"""

from __future__ import annotations

import numpy as np
import torch
from attrs import define, field
from torch import Tensor


def _positive(instance, attribute, value) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


def shifted_sigmas(num_steps: int, shift: float) -> np.ndarray:
    """The ``num_steps`` inference noise levels, from 1 down to (not including) 0, warped by ``shift``.

    float64 on the host (numpy), as Wan2.2 computes them; the caller casts once.
    """
    sigma = np.linspace(1.0, 0.0, num_steps + 1)[:num_steps]
    return shift * sigma / (1.0 + (shift - 1.0) * sigma)


@define(frozen=True)
class FlowSchedule:
    """One expert's schedule: ``num_train_timesteps`` N, ``shift`` s, and the weight normaliser's ``eps``."""

    num_train_timesteps: int = field(default=1000, validator=_positive)
    shift: float = field(default=5.0, converter=float, validator=_positive)
    eps: float = 1e-10
    _weight_floor: float = field(init=False)
    _weight_mean: float = field(init=False)

    def __attrs_post_init__(self) -> None:
        steps = self.num_train_timesteps
        u = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)[:-1]
        t = self._warp(u, self.shift) * float(steps)
        bell = torch.exp(-2.0 * ((t - steps / 2.0) / steps) ** 2)
        floor = float(bell.min().item())
        object.__setattr__(self, "_weight_floor", floor)
        object.__setattr__(self, "_weight_mean", float((bell - floor).mean().item()))

    @staticmethod
    def _warp(u: Tensor, shift: float) -> Tensor:
        return shift * u / (1.0 + (shift - 1.0) * u)

    def sample_timesteps(self, batch_size: int, device: torch.device | str, dtype: torch.dtype) -> Tensor:
        """``(batch_size,)`` training timesteps ``φ(u)·N``, drawn in float32 and cast to ``dtype``."""
        u = torch.rand((batch_size,), device=device, dtype=torch.float32)
        return (self._warp(u, self.shift) * float(self.num_train_timesteps)).to(dtype=dtype)

    def weight(self, timestep: Tensor) -> Tensor:
        """Per-sample loss weight (float32); a one-element input gives a 0-d weight."""
        t = timestep.to(dtype=torch.float32)
        steps = float(self.num_train_timesteps)
        bell = torch.exp(-2.0 * ((t - steps / 2.0) / steps) ** 2)
        weight = (bell - self._weight_floor) / (self._weight_mean + self.eps)
        return weight.reshape(()) if weight.numel() == 1 else weight

    def _sigma(self, timestep: Tensor, like: Tensor) -> Tensor:
        sigma = (timestep / float(self.num_train_timesteps)).to(like.device, dtype=like.dtype)
        return sigma if sigma.ndim == 0 else sigma.view(-1, *([1] * (like.ndim - 1)))

    def noisy(self, clean: Tensor, noise: Tensor, timestep: Tensor) -> Tensor:
        """``(1-σ)·clean + σ·noise`` with ``σ = t/N`` per sample, in ``clean``'s dtype."""
        sigma = self._sigma(timestep, clean)
        return (1 - sigma) * clean + sigma * noise

    @staticmethod
    def velocity(clean: Tensor, noise: Tensor) -> Tensor:
        """The regression target: ``noise - clean`` (independent of the timestep)."""
        return noise - clean

    def inference_steps(
        self, num_steps: int, device: torch.device | str, dtype: torch.dtype, shift: float | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(timesteps, deltas)``: the Euler grid's ``σ_k·N`` and ``σ_{k+1} - σ_k`` (``σ_K = 0``),
        in ``dtype``.

        ``shift`` overrides the schedule's own (``--policy.sigma_shift``).
        """
        if num_steps <= 0:
            raise ValueError(f"num_inference_steps must be positive, got {num_steps}")
        shift = self.shift if shift is None else float(shift)
        if shift <= 0:
            raise ValueError(f"sigma_shift must be positive, got {shift}")
        sigmas = torch.as_tensor(shifted_sigmas(num_steps, shift), device=device, dtype=torch.float32)
        following = torch.cat([sigmas[1:], sigmas.new_zeros(1)])
        return (sigmas * float(self.num_train_timesteps)).to(dtype=dtype), (following - sigmas).to(
            dtype=dtype
        )

    @staticmethod
    def euler(velocity: Tensor, delta: Tensor, sample: Tensor) -> Tensor:
        """One Euler step ``sample + velocity·delta`` (``delta`` scalar or per sample)."""
        delta = delta.to(sample.device, dtype=sample.dtype)
        if delta.ndim != 0:
            delta = delta.view(-1, *([1] * (sample.ndim - 1)))
        return sample + velocity * delta
