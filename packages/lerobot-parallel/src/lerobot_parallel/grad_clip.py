"""Gradient-norm clipping that works for plain, sharded (DTensor) and mixed gradients.

``torch.nn.utils.clip_grad_norm_`` handles all-DTensor gradients (its norm comes back as a
replicated DTensor), but refuses a list mixing DTensor and plain gradients (torch 2.15: "got
mixed torch.Tensor and DTensor"), which is exactly what ``ignored_modules`` produces. Here the
norm is computed per group of like gradients — per (mesh, placements) for DTensors, where
``full_tensor()`` reduces the partial norms over the mesh; locally for plain ones, which are
identical on every rank once synchronised — and combined, so every rank gets the same total and
scales its local shards by the same coefficient.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def _group_norm(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    norm = torch.nn.utils.get_total_norm(grads, norm_type)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return norm.float()


@torch.no_grad()
def total_grad_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type`` norm of all gradients as one vector (a collective when any are DTensors)."""
    norm_type = float(norm_type)
    groups: dict[object, list[torch.Tensor]] = {}
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else ("local", g.device)
        groups.setdefault(key, []).append(g)
    if not groups:
        return torch.tensor(0.0)
    norms = [_group_norm(grads, norm_type) for grads in groups.values()]
    device = norms[0].device
    stacked = torch.stack([n.to(device) for n in norms])
    if math.isinf(norm_type):
        return stacked.max()
    return stacked.pow(norm_type).sum().pow(1.0 / norm_type)


@torch.no_grad()
def clip_grad_norm(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Scale gradients in place so their total norm is at most ``max_norm``; returns the total norm
    before clipping as a plain (non-DTensor) scalar tensor, identical on every rank."""
    params = [p for p in parameters if p.grad is not None]
    total = total_grad_norm(params, norm_type)
    coef = (float(max_norm) / (total + 1e-6)).clamp(max=1.0)
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for p in params:  # local shards: every rank scales its own slice by the same coefficient
        g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        by_device.setdefault(g.device, []).append(g)
    for device, grads in by_device.items():  # one fused multiply per device, not one kernel per tensor
        torch._foreach_mul_(grads, coef.to(device))
    return total
