"""A tiny model and synthetic dataset that follow the loop's contracts.

Shipped (not hidden in a test folder) because tests of several packages, the benchmarks and
the README example all need the same deterministic workload: ``loss, info = model(batch)``
with ``info`` as detached 0-d tensors (reading them as floats here would cost a host sync per step), and samples that carry their own dataset ``index`` so a test can tell
exactly which samples each rank trained on.
"""

from __future__ import annotations

from typing import Self

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class TinyRegressor(nn.Module):
    """Two-layer MLP regressing ``batch["y"]`` from ``batch["x"]``; init depends only on ``seed``."""

    def __init__(self, in_dim: int = 8, hidden: int = 32, out_dim: int = 4, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, out_dim))

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pred = self.net(batch["x"]).float()  # loss in fp32 under autocast
        mse = F.mse_loss(pred, batch["y"].float())
        l1 = F.l1_loss(pred.detach(), batch["y"].float())
        return mse, {"mse": mse.detach(), "l1": l1}


class SyntheticRegression(Dataset):
    """``num_samples`` fixed (x, y) pairs from a random linear map plus noise."""

    def __init__(self, num_samples: int = 64, in_dim: int = 8, out_dim: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(num_samples, in_dim, generator=g)
        w = torch.randn(in_dim, out_dim, generator=g)
        self.y = self.x @ w + 0.1 * torch.randn(num_samples, out_dim, generator=g)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i], "index": torch.tensor(i)}

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """The collated batch of ``indices`` without a DataLoader (reference computations)."""
        idx = torch.as_tensor(indices)
        return {"x": self.x[idx], "y": self.y[idx], "index": idx}


# -- counting host syncs ------------------------------------------------------------------------
# Reads that make the host wait for the device when the tensor lives on an accelerator (on CPU they
# are where those syncs would be, which is why a CPU test can count them), and the blocking
# collectives (each one waits for every rank). Async collectives (async_op=True) are recorded apart:
# they wait for nothing when issued.
TENSOR_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
               "barrier", "monitored_barrier", "reduce", "gather", "gather_object", "scatter", "scatter_object_list")


class HostSyncCounter:
    """Records every tensor read (:data:`TENSOR_READS`, and ``.cpu()`` of a non-CPU tensor) and every
    ``torch.distributed`` collective (:data:`COLLECTIVES`) made while active, each with the label
    ``label()`` returns at that moment (e.g. the loop step it belongs to).

    ``with HostSyncCounter(label=lambda: loop.step) as c: ...`` then ``c.syncs(label)``: the blocking
    events under a label (``c.events`` has them all as ``(kind, name, label)``; kind is ``read``,
    ``collective`` or ``async``). Patches the classes and modules while active, so use it in one thread.
    """

    def __init__(self, label=lambda: None) -> None:
        self.label = label
        self.events: list[tuple[str, str, object]] = []
        self._undo: list[tuple[object, str, object, bool]] = []
        self._depth = 0  # a read inside a read (float() calls item()) or a collective inside one counts once

    def _patch(self, owner: object, name: str, make) -> None:
        real = getattr(owner, name, None)
        if real is None:
            return
        self._undo.append((owner, name, real, name in vars(owner)))

        def outer(*args, **kwargs):
            self._depth += 1
            try:
                return wrapped(*args, **kwargs)
            finally:
                self._depth -= 1

        wrapped = make(real)
        setattr(owner, name, outer)

    def _record(self, kind: str, name: str) -> None:
        if self._depth == 1:
            self.events.append((kind, name, self.label()))

    def __enter__(self) -> Self:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        def reader(name):
            def make(real):
                def counted(t, *args, **kwargs):
                    self._record("read", name)
                    return real(t, *args, **kwargs)
                return counted
            return make

        for name in TENSOR_READS:
            self._patch(torch.Tensor, name, reader(name))

        def make_cpu(real):
            def cpu(t, *args, **kwargs):
                if t.device.type != "cpu":
                    self._record("read", "cpu")
                return real(t, *args, **kwargs)
            return cpu

        self._patch(torch.Tensor, "cpu", make_cpu)

        def collective(name):
            def make(real):
                def counted(*args, **kwargs):
                    self._record("async" if kwargs.get("async_op") else "collective", name)
                    return real(*args, **kwargs)
                return counted
            return make

        for name in COLLECTIVES:
            for module in (dist, c10d):
                self._patch(module, name, collective(name))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, real, own in reversed(self._undo):
            if own:
                setattr(owner, name, real)
            else:  # inherited (torch.Tensor's reads come from its C base): drop the override
                delattr(owner, name)
        self._undo.clear()

    def syncs(self, label: object = None, *, any_label: bool = False) -> list[str]:
        """Names of the blocking events (reads and blocking collectives) under ``label``."""
        return [name for kind, name, lab in self.events
                if kind != "async" and (any_label or lab == label)]
