"""The held-out eval loss: every data-parallel rank evaluates its share, one all-reduce combines them.

The value is the *sample-weighted* mean of the model's batch losses over the whole held-out set,
``Σ n_b · loss_b / Σ n_b`` summed over every rank's batches, so it is the same number (up to float
summation order) whatever the number of ranks or the batch size: one process and DDP x2 report the
same eval loss for the same held-out set. (A mean of per-rank means, as LeRobot computes it,
changes with the split.) The same holds for each of the policy's loss parts (``eval/<part>``).

Sharding: rank r takes the contiguous r-th slice of ``ceil(N / W)`` indices. Every rank runs the
same number of forward passes, since a sharded (FSDP2) forward is collective: a rank whose slice
ran out evaluates a placeholder batch (the set's first sample) with weight 0.

The eval does not disturb training: the model is in eval mode inside it (dropout off, as
LeRobot's), the RNG streams are forked (and, with ``seed``, seeded before each batch, so noise a
policy draws per sample is the same whatever the batch, rank or step) (a run with an eval every N steps trains
exactly as one without), and with an EMA and ``ema.use_for_eval`` the EMA weights are swapped in (local
shards, no collective) and the live ones restored bitwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from lerobot_trainloop.batch import move_to_device
from lerobot_trainloop.ema import ModelEma
from lerobot_trainloop.metrics import accumulation_dtype


class EvalBatches:
    """Batch sampler of one rank's share of a held-out set (``indices``: the set, in order).

    Yields ``num_batches`` index lists on every rank; :meth:`weights` gives each batch's number of
    real samples (0 for a placeholder), in the same order.
    """

    def __init__(
        self, indices: Sequence[int], batch_size: int, *, dp_rank: int = 0, dp_world_size: int = 1
    ) -> None:
        if not indices:
            raise ValueError("the held-out set is empty")
        if batch_size < 1 or not 0 <= dp_rank < dp_world_size:
            raise ValueError(
                f"invalid eval sharding: batch_size={batch_size}, dp_rank={dp_rank}, "
                f"dp_world_size={dp_world_size}"
            )
        self.indices = list(indices)
        share = math.ceil(len(self.indices) / dp_world_size)
        self.mine = self.indices[dp_rank * share : (dp_rank + 1) * share]
        self.batch_size = batch_size
        self.num_batches = math.ceil(share / batch_size)

    def _batches(self) -> Iterator[list[int]]:
        for b in range(self.num_batches):
            yield self.mine[b * self.batch_size : (b + 1) * self.batch_size]

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self._batches():
            yield batch or [self.indices[0]]

    def __len__(self) -> int:
        return self.num_batches

    def weights(self) -> list[int]:
        return [len(b) for b in self._batches()]

    @property
    def num_samples(self) -> int:
        return len(self.indices)


def reshard_gathered(model: torch.nn.Module) -> None:
    """Free what FSDP2 gathered for an eval forward. A forward without backward leaves the root's
    parameters (never resharded after forward) and any ``reshard_after_forward=False`` unit gathered; the
    next training forward would reuse them as they are, i.e. with the EMA weights swapped in for the eval
    (a silently wrong step). Resharding makes the next forward gather the live shards."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


@contextmanager
def evaluating(model: torch.nn.Module, device: torch.device, ema: ModelEma | None = None) -> Iterator[None]:
    """The weights an eval computes with, without disturbing training: ``model`` in eval mode (dropout
    off), the RNG streams forked (an eval that draws noise leaves training's draws as they were), the EMA
    weights swapped in when ``ema`` is given; on the way out FSDP2's gathered parameters are freed
    (:func:`reshard_gathered`, before the live weights come back) and the mode restored. Local only: no
    collective of its own (the caller's forwards are collective when sharded)."""
    was_training = model.training
    devices = [device] if device.type == "cuda" else []
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices), ema.swapped() if ema is not None else nullcontext():
            try:
                yield
            finally:
                reshard_gathered(model)
    finally:
        model.train(was_training)


def _as_tensor(value, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).to(device=device, dtype=dtype)
    return torch.tensor(float(value), device=device, dtype=dtype)


@torch.no_grad()
def evaluate(
    loop, batches: Iterable, weights: Sequence[int], *, ema: ModelEma | None = None, seed: int | None = None
) -> dict[str, float]:
    """``{"loss": ..., <part>: ...}`` over the held-out set (the same on every dp rank).

    ``loop`` is the :class:`~lerobot_trainloop.TrainLoop` (its model, precision and runtime);
    ``batches`` this rank's preprocessed batches in :class:`EvalBatches` order and ``weights`` their
    :meth:`EvalBatches.weights`. Collective over the dp group: every rank calls it at the same step.
    One device→host read, after the all-reduce. ``seed``: the RNG is seeded with it before every batch
    (inside the fork), so a policy that draws noise (diffusion's noise and timesteps, keyed by the
    sample's index) draws the same for a sample whatever its batch, its rank or the eval step: the
    value then depends on the weights alone.
    """
    rt, model = loop.runtime, loop.model
    device = rt.device
    dtype = accumulation_dtype(device)
    sums: dict[str, torch.Tensor] = {}
    total = 0
    n_batches = 0
    with evaluating(model, device, ema):
        for batch, n in zip(batches, weights, strict=True):
            n_batches += 1
            if seed is not None:
                torch.manual_seed(seed)
            with loop.precision.autocast():
                loss, info = model(move_to_device(batch, device))
            parts = {"loss": loss, **(info or {})}
            for name, value in parts.items():
                term = _as_tensor(value, device, dtype) * n
                sums[name] = sums[name] + term if name in sums else term
            total += n
    if n_batches == 0:
        raise ValueError("the eval batches were empty")
    names = sorted(sums)
    packed = torch.stack([torch.tensor(float(total), device=device, dtype=dtype), *(sums[k] for k in names)])
    if rt.dp_group is not None and rt.dp_world_size > 1:
        dist.all_reduce(packed, group=rt.dp_group)
    values = packed.tolist()
    count = values[0]
    return {name: v / count for name, v in zip(names, values[1:], strict=True)}
