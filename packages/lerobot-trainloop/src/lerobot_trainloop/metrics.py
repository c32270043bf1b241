"""Windowed meters and their cross-rank reduction in one collective, read from the device once.

Each meter averages its values over the current log window on this rank. A value may be a host
number (timings, sample counts, the lr) or a 0-d tensor (the loss, its parts, the gradient norm):
tensors are detached and summed *on their device*, so updating a meter never waits for the device
(no ``.item()``, no ``float()``). The device is read only when the window is: at a log step every
rank packs all window values into ONE tensor on the reduction device (:meth:`MetricsTracker.pack`),
all-gathers it (one collective, works on gloo and nccl; an all-reduce could not mix mean and max)
and reads the gathered table with one ``tolist()`` (one device→host copy). Each column is then
reduced with its meter's own rule: losses averaged over ranks, times max'ed (the slowest rank sets
the pace), sample counts summed. A meter with no value in the window travels as NaN and is ignored
by the reduction, so a rank that had nothing to report does not drag a mean towards zero.

Every rank must hold the same meter names at a log step (true when they come from the same
code); a checksum of the names travels with the values so a mismatch is an error, not silent
garbage. The loop appends its own status columns (the non-finite-loss record) to the packed vector,
which is why packing, gathering and combining are separate steps.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from attrs import define

REDUCTIONS = ("mean", "max", "min", "sum", "local")


def accumulation_dtype(device: torch.device | str) -> torch.dtype:
    """float64 for window sums and the packed vector, except where the device has none (MPS)."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


@define
class Meter:
    """Mean of the values seen in the current window; ``reduction`` says how ranks combine.

    Host numbers add into ``total``; tensors add into ``device_total`` on their own device (detached),
    so an update never synchronises with the device. ``value`` reads it (a host sync when a tensor was
    added); the tracker's :meth:`MetricsTracker.pack` does not.
    """

    reduction: str = "mean"
    total: float = 0.0
    count: int = 0
    device_total: torch.Tensor | None = None

    def __attrs_post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")

    def update(self, value: float | torch.Tensor) -> None:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"a meter takes one number per update, got a tensor of shape {tuple(value.shape)}"
                )
            v = value.detach().reshape(()).to(accumulation_dtype(value.device))
            self.device_total = v if self.device_total is None else self.device_total + v
        else:
            self.total += float(value)
        self.count += 1

    def window_sum(self, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor | None:
        """The device part of the window's sum on ``device`` (None when only host numbers came)."""
        return None if self.device_total is None else self.device_total.to(device=device, dtype=dtype)

    @property
    def value(self) -> float:
        """The window mean (NaN when empty); reads the device when tensors were added."""
        if not self.count:
            return math.nan
        device_part = 0.0 if self.device_total is None else float(self.device_total)
        return (self.total + device_part) / self.count

    def reset(self) -> None:
        self.total, self.count, self.device_total = 0.0, 0, None


def _names_checksum(names: list[str]) -> float:
    return float(zlib.crc32("\0".join(names).encode()))


def _reduce_column(col: Sequence[float], how: str) -> float:
    finite = [v for v in col if not math.isnan(v)]
    if not finite:
        return math.nan
    if how == "mean":
        return math.fsum(finite) / len(finite)
    if how == "max":
        return max(finite)
    if how == "min":
        return min(finite)
    return math.fsum(finite)


def gather_rows(
    packed: torch.Tensor, group: dist.ProcessGroup | None = None, world_size: int = 1
) -> list[list[float]]:
    """Every rank's ``packed`` vector, as host rows ``[rank][column]``: one all-gather when
    ``world_size > 1`` (a collective on every rank of ``group``), then ONE device→host read."""
    if world_size <= 1:
        return [packed.tolist()]
    gathered = torch.empty(world_size * packed.numel(), dtype=packed.dtype, device=packed.device)
    dist.all_gather_into_tensor(gathered, packed, group=group)
    return gathered.view(world_size, packed.numel()).tolist()


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

    def update(self, name: str, value: float | torch.Tensor, reduction: str | None = None) -> None:
        """Add ``value`` (a number, or a one-element tensor kept on its device) to the window."""
        if name not in self.meters:
            self.meters[name] = Meter(reduction or self.default_reduction)
        self.meters[name].update(value)

    def local(self) -> dict[str, float]:
        """This rank's window values (no communication; reads the device once)."""
        on = next((m.device_total.device for m in self.meters.values() if m.device_total is not None), "cpu")
        return dict(zip(sorted(self.meters), self.pack(on).tolist()[1:], strict=True))

    def pack(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[names checksum, window mean of each meter (sorted by name)]`` as one 1-D tensor on ``device``.

        No host sync: host sums travel in one host→device copy and device sums are added on the
        device. Read it with :func:`gather_rows`, then :meth:`combine`."""
        names = sorted(self.meters)
        dtype = accumulation_dtype(device)
        meters = [self.meters[n] for n in names]
        host = [_names_checksum(names)] + [m.total / m.count if m.count else math.nan for m in meters]
        packed = torch.tensor(host, dtype=dtype, device=device)
        with_device = [
            (i, m) for i, m in enumerate(meters, start=1) if m.device_total is not None and m.count
        ]
        if with_device:
            rows = torch.tensor([i for i, _ in with_device], device=device)
            sums = torch.stack([m.window_sum(device, dtype) / m.count for _, m in with_device])
            packed = packed.index_add(0, rows, sums)
        return packed

    def combine(self, rows: Sequence[Sequence[float]], rank: int = 0) -> dict[str, float]:
        """Reduce :meth:`pack`'s columns of every rank (what :func:`gather_rows` returns) meter by meter;
        ``rows[rank]`` is this rank's row, whose values "local" meters keep."""
        names = sorted(self.meters)
        if any(row[0] != rows[0][0] for row in rows):
            raise RuntimeError(
                f"metric names differ between ranks at a log step (this rank has {names}); every rank must "
                "report the same metrics"
            )
        out: dict[str, float] = {}
        for i, name in enumerate(names, start=1):
            how = self.meters[name].reduction
            out[name] = rows[rank][i] if how == "local" else _reduce_column([row[i] for row in rows], how)
        return out

    def reduce(
        self, group: dist.ProcessGroup | None = None, device: torch.device | str = "cpu", world_size: int = 1
    ) -> dict[str, float]:
        """Window values combined over ranks; a collective on every rank of ``group`` when
        ``world_size > 1``, none otherwise; one device→host read either way. Does not reset (call
        :meth:`reset`)."""
        rank = dist.get_rank(group) if world_size > 1 else 0
        return self.combine(gather_rows(self.pack(device), group, world_size), rank)

    def reset(self) -> None:
        for meter in self.meters.values():
            meter.reset()
