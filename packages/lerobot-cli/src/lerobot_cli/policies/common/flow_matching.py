"""Flow-matching pieces the VLA policies (pi0, pi05, SmolVLA) share, each as LeRobot/openpi compute them.

- ``sinusoidal_time_embedding``: openpi's sine-cosine embedding of the flow time.
- ``sample_flow_noise`` / ``sample_beta_time``: the training noise and ``Beta(α, β)·scale + offset`` time.
- ``draw_noise_and_time``: those draws keyed by each sample's dataset ``index``, so that every DDP/FSDP
  layout of one global batch computes the same loss as one process.
- ``euler_integrate``: inference's forward Euler steps from t=1 (noise) down to t=0.

The arithmetic is kept exactly as it was in each policy (the results are bit-equal with LeRobot's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from lerobot_cli.policies.common.index_draws import index_keyed_draws

NoiseSampler = Callable[[Sequence[int], torch.device], Tensor]
TimeSampler = Callable[[int, torch.device], Tensor]


def sinusoidal_time_embedding(time: Tensor, dim: int, min_period: float, max_period: float) -> Tensor:
    """openpi's sine-cosine embedding of the flow time ``(B,)`` → ``(B, dim)``,
    computed in float64 off MPS."""
    if dim % 2:
        raise ValueError(f"the time embedding width must be even, got {dim}")
    dtype = torch.float32 if time.device.type == "mps" else torch.float64
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=dtype, device=time.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None, :] * time[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)


def sample_flow_noise(shape: Sequence[int], device: torch.device) -> Tensor:
    """Standard normal fp32 noise of ``shape``, the flow's t=1 end."""
    return torch.normal(0.0, 1.0, size=tuple(shape), dtype=torch.float32, device=device)


def sample_beta_time(
    batch_size: int, device: torch.device, alpha: float, beta: float, scale: float, offset: float
) -> Tensor:
    """``Beta(alpha, beta) * scale + offset``, drawn on the CPU (Beta has no kernel on some devices)."""
    dist = torch.distributions.Beta(
        torch.tensor(alpha, dtype=torch.float32), torch.tensor(beta, dtype=torch.float32)
    )
    time = dist.sample((batch_size,)).to(device) * scale + offset
    return time.to(dtype=torch.float32, device=device)


def draw_noise_and_time(
    batch: Mapping[str, Any], actions: Tensor, sample_noise: NoiseSampler, sample_time: TimeSampler
) -> tuple[Tensor, Tensor]:
    """The flow noise, then the time, of each sample (LeRobot's order), keyed by the sample's dataset
    ``index`` (:func:`~lerobot_cli.policies.common.index_draws.index_keyed_draws`). Without an ``index``
    (a foreign batch) the draws come from the global RNG directly, as in LeRobot."""
    index = batch.get("index")
    if not isinstance(index, Tensor) or index.numel() != actions.shape[0]:
        return sample_noise(actions.shape, actions.device), sample_time(actions.shape[0], actions.device)
    cpu = torch.device("cpu")
    noise, time = index_keyed_draws(
        index, lambda: (sample_noise((1, *actions.shape[1:]), cpu), sample_time(1, cpu)), actions.device
    )
    return noise, time


def euler_integrate(noise: Tensor, steps: int, velocity: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """Forward Euler from ``noise`` at t=1 to t=0 in ``steps`` steps: ``x += dt · velocity(x, t)`` with
    ``dt = -1/steps`` and ``t`` an fp32 ``(B,)`` tensor on the noise's device."""
    batch = noise.shape[0]
    dt = -1.0 / steps
    x_t = noise
    for step in range(steps):
        time = torch.tensor(1.0 + step * dt, dtype=torch.float32, device=noise.device).expand(batch)
        x_t = x_t + dt * velocity(x_t, time)
    return x_t
