"""Windowed meters and their cross-rank reduction in one collective.

Each meter averages its values over the current log window on this rank; at a log step every
rank packs all window values into ONE float64 tensor and all-gathers it (one collective, works
on gloo and nccl; an all-reduce could not mix mean and max). Each column is then reduced with
its meter's own rule: losses averaged over ranks, times max'ed (the slowest rank sets the pace),
sample counts summed. A meter with no value in the window travels as NaN and is ignored by the
reduction, so a rank that had nothing to report does not drag a mean towards zero.

Every rank must hold the same meter names at a log step (true when they come from the same
code); a checksum of the names travels with the values so a mismatch is an error, not silent
garbage.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping

import torch
import torch.distributed as dist
from attrs import define

REDUCTIONS = ("mean", "max", "min", "sum", "local")


@define
class Meter:
    """Mean of the values seen in the current window; ``reduction`` says how ranks combine."""

    reduction: str = "mean"
    total: float = 0.0
    count: int = 0

    def __attrs_post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")

    def update(self, value: float) -> None:
        self.total += float(value)
        self.count += 1

    @property
    def value(self) -> float:
        return self.total / self.count if self.count else math.nan

    def reset(self) -> None:
        self.total, self.count = 0.0, 0


def _names_checksum(names: list[str]) -> float:
    return float(zlib.crc32("\0".join(names).encode()))


def _reduce_column(col: torch.Tensor, how: str) -> float:
    finite = col[~torch.isnan(col)]
    if finite.numel() == 0:
        return math.nan
    if how == "mean":
        return float(finite.mean())
    if how == "max":
        return float(finite.max())
    if how == "min":
        return float(finite.min())
    return float(finite.sum())


class MetricsTracker:
    """Named meters; unknown names are created on first update with ``default_reduction``."""

    def __init__(self, reductions: Mapping[str, str] | None = None, default_reduction: str = "mean") -> None:
        self.meters: dict[str, Meter] = {n: Meter(r) for n, r in (reductions or {}).items()}
        self.default_reduction = default_reduction

    def declare(self, name: str, reduction: str) -> None:
        meter = self.meters.get(name)
        if meter is None:
            self.meters[name] = Meter(reduction)
        elif meter.reduction != reduction:
            raise ValueError(f"meter {name!r} already reduces by {meter.reduction!r}, not {reduction!r}")

    def update(self, name: str, value: float, reduction: str | None = None) -> None:
        if name not in self.meters:
            self.meters[name] = Meter(reduction or self.default_reduction)
        self.meters[name].update(value)

    def local(self) -> dict[str, float]:
        """This rank's window values (no communication)."""
        return {name: m.value for name, m in sorted(self.meters.items())}

    def reduce(self, group: dist.ProcessGroup | None = None, device: torch.device | str = "cpu",
               world_size: int = 1) -> dict[str, float]:
        """Window values combined over ranks; a collective on every rank of ``group`` when
        ``world_size > 1``, none otherwise. Does not reset (call :meth:`reset`)."""
        names = sorted(self.meters)
        values = [self.meters[n].value for n in names]
        if world_size <= 1:
            return dict(zip(names, values, strict=True))
        packed = torch.tensor([_names_checksum(names), *values], dtype=torch.float64, device=device)
        gathered = torch.empty(world_size * packed.numel(), dtype=torch.float64, device=device)
        dist.all_gather_into_tensor(gathered, packed, group=group)
        table = gathered.view(world_size, packed.numel()).cpu()
        if not torch.all(table[:, 0] == table[0, 0]):
            raise RuntimeError(
                f"metric names differ between ranks at a log step (this rank has {names}); every rank must "
                "report the same metrics"
            )
        out: dict[str, float] = {}
        for i, name in enumerate(names, start=1):
            how = self.meters[name].reduction
            out[name] = values[i - 1] if how == "local" else _reduce_column(table[:, i], how)
        return out

    def reset(self) -> None:
        for meter in self.meters.values():
            meter.reset()
