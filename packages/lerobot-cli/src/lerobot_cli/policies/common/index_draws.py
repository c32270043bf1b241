"""Random draws keyed by each sample's dataset ``index``, so that every DDP/FSDP/HSDP layout of one global
batch draws what one process draws (pi0, pi05, SmolVLA, diffusion and FastWAM train with them).

One draw of the global RNG (every rank seeds it alike and draws in lockstep; a resume restores it) plus
the sample's index seed a forked RNG, under which the policy draws that sample's noise and timesteps:
a sample gets the same draws whichever rank and micro-batch it lands in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

# Golden-ratio multiplier: spreads consecutive dataset indices over the seed space.
_INDEX_SEED_STRIDE = 0x9E3779B97F4A7C15


def index_keyed_draws(
    index: Tensor, draw: Callable[[], Sequence[Tensor]], device: torch.device
) -> tuple[Tensor, ...]:
    """``draw()`` once per sample of ``index`` (host tensors with a leading dimension of 1, drawn in the
    policy's order), each under the RNG seeded from the base draw and that index; each part concatenated
    over the samples and moved to ``device``."""
    base = int(torch.randint(0, 2**62, ()))
    rows: list[Sequence[Tensor]] = []
    for sample in index.reshape(-1).tolist():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((base + _INDEX_SEED_STRIDE * (int(sample) + 1)) % 2**63)
            rows.append(tuple(draw()))
    # index is a host value (lerobot_trainloop HOST_KEYS): drawn on the host, copied without a sync
    return tuple(torch.cat(parts).to(device, non_blocking=True) for parts in zip(*rows, strict=True))
