"""DDPM and DDIM noise schedules: the part of diffusers' ``DDPMScheduler`` / ``DDIMScheduler`` that
LeRobot's Diffusion Policy uses, written out (about a hundred lines instead of a dependency).

LeRobot builds them with ``num_train_timesteps``, ``beta_start``/``beta_end``, ``beta_schedule``,
``clip_sample``/``clip_sample_range`` and ``prediction_type`` and keeps every other diffusers default:
``fixed_small`` variance (DDPM), ``eta=0`` and ``set_alpha_to_one=True`` (DDIM), "leading" timestep
spacing, no offset, no thresholding. Those are the semantics here, computed in the same float32 order,
so ``add_noise`` / ``step`` agree with diffusers to float rounding; DDPM's per-step noise is one
``torch.randn`` of the sample's shape per step with ``t > 0``, drawn as diffusers draws it, so a seeded
run draws the same noise in both.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def make_betas(schedule: str, num_train_timesteps: int, beta_start: float, beta_end: float) -> Tensor:
    """float32 betas of a named schedule (diffusers' names and formulas)."""
    if schedule == "linear":
        return torch.linspace(beta_start, beta_end, num_train_timesteps, dtype=torch.float32)
    if schedule == "scaled_linear":
        return torch.linspace(beta_start**0.5, beta_end**0.5, num_train_timesteps, dtype=torch.float32) ** 2
    if schedule == "squaredcos_cap_v2":
        # Nichol & Dhariwal's cosine schedule: beta_i = 1 - abar(t_{i+1}) / abar(t_i), capped at 0.999.
        def alpha_bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

        n = num_train_timesteps
        return torch.tensor(
            [min(1 - alpha_bar((i + 1) / n) / alpha_bar(i / n), 0.999) for i in range(n)], dtype=torch.float32
        )
    raise ValueError(f"unsupported beta schedule {schedule!r}")


class NoiseScheduler:
    """Shared state: betas, cumulative alphas, the inference timesteps."""

    def __init__(
        self,
        *,
        num_train_timesteps: int = 100,
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        beta_schedule: str = "squaredcos_cap_v2",
        clip_sample: bool = True,
        clip_sample_range: float = 1.0,
        prediction_type: str = "epsilon",
    ) -> None:
        if prediction_type not in ("epsilon", "sample"):
            raise ValueError(f"unsupported prediction type {prediction_type!r} (epsilon or sample)")
        self.num_train_timesteps = num_train_timesteps
        self.clip_sample = clip_sample
        self.clip_sample_range = clip_sample_range
        self.prediction_type = prediction_type
        self.betas = make_betas(beta_schedule, num_train_timesteps, beta_start, beta_end)
        self.alphas_cumprod = torch.cumprod(1.0 - self.betas, dim=0)
        self.one = torch.tensor(1.0)
        self.num_inference_steps: int | None = None
        self.timesteps = torch.arange(num_train_timesteps - 1, -1, -1, dtype=torch.int64)

    def set_timesteps(self, num_inference_steps: int) -> None:
        """Evenly spaced from 0 ("leading"): ``[(n-1)·r, …, r, 0]`` with ``r = T // n``."""
        if not 1 <= num_inference_steps <= self.num_train_timesteps:
            raise ValueError(
                f"num_inference_steps must be in [1, {self.num_train_timesteps}], got {num_inference_steps}"
            )
        self.num_inference_steps = num_inference_steps
        ratio = self.num_train_timesteps // num_inference_steps
        self.timesteps = torch.from_numpy(
            (np.arange(num_inference_steps) * ratio)[::-1].copy().astype(np.int64)
        )

    def add_noise(self, original: Tensor, noise: Tensor, timesteps: Tensor) -> Tensor:
        """Forward diffusion: ``sqrt(abar_t)·x0 + sqrt(1 - abar_t)·eps`` per batch element."""
        abar = self.alphas_cumprod.to(device=original.device, dtype=original.dtype)[
            timesteps.to(original.device)
        ]
        shape = (-1,) + (1,) * (original.dim() - 1)
        return (abar**0.5).reshape(shape) * original + ((1 - abar) ** 0.5).reshape(shape) * noise

    def _alpha_prod(self, t: int) -> Tensor:
        return self.alphas_cumprod[t] if t >= 0 else self.one

    def _predicted_original(self, model_output: Tensor, t: int, sample: Tensor) -> Tensor:
        alpha_prod_t = self.alphas_cumprod[t]
        if self.prediction_type == "epsilon":
            x0 = (sample - (1 - alpha_prod_t) ** 0.5 * model_output) / alpha_prod_t**0.5
        else:
            x0 = model_output
        if self.clip_sample:
            x0 = x0.clamp(-self.clip_sample_range, self.clip_sample_range)
        return x0


class DDPMScheduler(NoiseScheduler):
    def previous_timestep(self, t: int) -> int:
        if self.num_inference_steps is None:
            return t - 1
        index = int((self.timesteps == t).nonzero()[0, 0])
        return -1 if index == len(self.timesteps) - 1 else int(self.timesteps[index + 1])

    def step(
        self,
        model_output: Tensor,
        timestep: int | Tensor,
        sample: Tensor,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """One reverse step ``x_t -> x_{t_prev}`` (the posterior mean plus ``fixed_small`` noise)."""
        t = int(timestep)
        prev_t = self.previous_timestep(t)
        alpha_prod_t, alpha_prod_prev = self.alphas_cumprod[t], self._alpha_prod(prev_t)
        beta_prod_t, beta_prod_prev = 1 - alpha_prod_t, 1 - alpha_prod_prev
        current_alpha_t = alpha_prod_t / alpha_prod_prev
        current_beta_t = 1 - current_alpha_t
        x0 = self._predicted_original(model_output, t, sample)
        x0_coeff = (alpha_prod_prev**0.5 * current_beta_t) / beta_prod_t
        sample_coeff = current_alpha_t**0.5 * beta_prod_prev / beta_prod_t
        prev = x0_coeff * x0 + sample_coeff * sample
        if t > 0:
            noise = torch.randn(
                model_output.shape, generator=generator, device=model_output.device, dtype=model_output.dtype
            )
            variance = torch.clamp(beta_prod_prev / beta_prod_t * current_beta_t, min=1e-20)
            prev = prev + variance**0.5 * noise
        return prev


class DDIMScheduler(NoiseScheduler):
    def step(
        self,
        model_output: Tensor,
        timestep: int | Tensor,
        sample: Tensor,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """One deterministic (eta = 0) DDIM step to ``t - T // n``."""
        if self.num_inference_steps is None:
            raise ValueError("call set_timesteps before step")
        t = int(timestep)
        prev_t = t - self.num_train_timesteps // self.num_inference_steps
        alpha_prod_t, alpha_prod_prev = self.alphas_cumprod[t], self._alpha_prod(prev_t)
        beta_prod_t = 1 - alpha_prod_t
        x0 = self._predicted_original(model_output, t, sample)
        if self.prediction_type == "epsilon":
            eps = model_output
        else:  # from the unclipped prediction, as diffusers does
            eps = (sample - alpha_prod_t**0.5 * model_output) / beta_prod_t**0.5
        return alpha_prod_prev**0.5 * x0 + (1 - alpha_prod_prev) ** 0.5 * eps


def make_noise_scheduler(name: str, **kwargs) -> NoiseScheduler:
    if name == "DDPM":
        return DDPMScheduler(**kwargs)
    if name == "DDIM":
        return DDIMScheduler(**kwargs)
    raise ValueError(f"unsupported noise scheduler {name!r} (DDPM or DDIM)")
