"""A tiny model and synthetic dataset that follow the loop's contracts.

Shipped (not hidden in a test folder) because tests of several packages, the benchmarks and
the README example all need the same deterministic workload: ``loss, info = model(batch)``
with ``info`` as detached 0-d tensors (reading them as floats here would cost a host sync per step), and
samples that carry their own dataset ``index`` so a test can tell exactly which samples each rank trained on.
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
# Reads: every call that hands tensor values (or a shape that depends on them) to the host. On an
# accelerator each one waits for the device; on CPU they are where those waits would be, which is why a
# CPU test can count them. TENSOR_READS are counted whatever the tensor's device, and so are the calls
# that name the host (.cpu(), .numpy(), .to("cpu")); the data-dependent shapes (DATA_DEPENDENT, and
# indexing with a boolean mask) too. Collectives are counted by name: a blocking one waits for every
# rank; an async one (async_op=True) is recorded apart, it waits for nothing when issued.
TENSOR_READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__", "__complex__")
VALUE_READS = (
    "equal",
    "allclose",
    "is_nonzero",
)  # torch functions and tensor methods returning a Python bool
DATA_DEPENDENT = ("nonzero", "argwhere", "masked_select", "unique", "unique_consecutive")
SYNCHRONIZE = ("torch.cuda.synchronize", "torch.accelerator.synchronize")
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
)


def _is_mask(index: object) -> bool:
    """A boolean (or legacy uint8) tensor index, alone or inside a tuple:
    its result's shape is the mask's count."""
    if isinstance(index, tuple):
        return any(_is_mask(i) for i in index)
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _to_host(t: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """Whether ``t.to(*args, **kwargs)`` is a blocking copy to the host: a non-CPU tensor to CPU, or any
    tensor to the host named as a string (``"cpu"``). A ``torch.device`` object stands for the run's device
    (on a CPU run, ``cpu``), so ``t.to(runtime.device)`` is an upload, not a read; ``non_blocking=True``
    waits for nothing."""
    flags = [a for a in args if isinstance(a, bool)]  # to(device, dtype, non_blocking, copy)
    if kwargs.get("non_blocking", bool(flags and flags[0])):
        return False
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.Tensor):
        target = target.device
    if isinstance(target, str):
        return torch.device(target).type == "cpu"
    return isinstance(target, torch.device) and target.type == "cpu" and t.device.type != "cpu"


class HostSyncCounter:
    """Records every host read of tensor values and every ``torch.distributed`` collective made while
    active, each as ``(kind, name, label)`` with the label ``label()`` returns at that moment (e.g. the loop
    step it belongs to).

    Counted as reads (kind ``read``), on any device: :data:`TENSOR_READS` (``item``, ``tolist``, ``numpy``,
    ``float(t)``, ``if t:``, ...), :data:`VALUE_READS` (``torch.equal``, ``allclose``), ``.cpu()``,
    ``.to(...)`` to the host (see :func:`_to_host`), ``dst.copy_(src)`` from a non-CPU ``src`` into a CPU
    ``dst`` (blocking), the ops whose output shape depends on values (:data:`DATA_DEPENDENT`:
    ``nonzero``, ``masked_select``, ... as methods or ``torch`` functions, ``torch.where(cond)``),
    boolean-mask indexing (``t[mask]``, ``t[mask] = v``) and explicit synchronisation
    (:data:`SYNCHRONIZE`). Collectives (:data:`COLLECTIVES`) are ``collective`` or, with
    ``async_op=True``, ``async``.

    What a CPU run cannot see: a CPU-to-CPU ``copy_`` (on an accelerator it may be a device-side copy or
    a download: only the device tells), a ``.to(device)`` with a ``torch.device`` object (the run's own
    device, on CPU the host), a read made inside C++ (DDP's reducer, FSDP's kernels), and a read
    through a name bound before the counter started (``from torch import nonzero``).

    ``with HostSyncCounter(label=lambda: loop.step) as c: ...`` then ``c.syncs(label)``: the blocking
    events under a label (``c.events`` has them all). A read inside a counted call (``float(t)`` calls
    ``item``; ``all_gather_object`` reads sizes) counts once. Patches classes and modules while active,
    so use it in one thread.
    """

    def __init__(self, label=lambda: None) -> None:
        self.label = label
        self.events: list[tuple[str, str, object]] = []
        self._undo: list[tuple[object, str, object, bool]] = []
        self._depth = 0  # > 0 inside a counted call

    def _patch(self, owner: object, name: str, event) -> None:
        """Replace ``owner.name`` with a wrapper that asks ``event(*args, **kwargs)`` for ``(kind, label)``
        (None: not an event) and records it unless already inside a counted call."""
        real = getattr(owner, name, None)
        if real is None:
            return
        self._undo.append((owner, name, real, name in vars(owner)))

        def counted(*args, **kwargs):
            found = event(*args, **kwargs)
            if found is None:
                return real(*args, **kwargs)
            if self._depth == 0:
                self.events.append((*found, self.label()))
            self._depth += 1
            try:
                return real(*args, **kwargs)
            finally:
                self._depth -= 1

        setattr(owner, name, counted)

    def __enter__(self) -> Self:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        def always(name: str):
            return lambda *args, **kwargs: ("read", name)

        for name in TENSOR_READS:
            self._patch(torch.Tensor, name, always(name))
        for name in (*VALUE_READS, *DATA_DEPENDENT):
            self._patch(torch.Tensor, name, always(name))
            self._patch(torch, name, always(name))
        self._patch(torch.Tensor, "cpu", always("cpu"))
        self._patch(torch.Tensor, "to", lambda t, *a, **k: ("read", "to_cpu") if _to_host(t, a, k) else None)

        def copy(dst, src, non_blocking=False):
            blocking_download = (
                isinstance(src, torch.Tensor)
                and dst.device.type == "cpu"
                and src.device.type != "cpu"
                and not non_blocking
            )
            return ("read", "copy_to_host") if blocking_download else None

        self._patch(torch.Tensor, "copy_", copy)
        self._patch(
            torch.Tensor, "__getitem__", lambda t, index: ("read", "mask_index") if _is_mask(index) else None
        )
        self._patch(
            torch.Tensor,
            "__setitem__",
            lambda t, index, value: ("read", "mask_assign") if _is_mask(index) else None,
        )
        self._patch(
            torch,
            "where",
            lambda *args, **kwargs: ("read", "where") if len(args) + len(kwargs) == 1 else None,
        )
        for qualified in SYNCHRONIZE:
            module_name, _, name = qualified.rpartition(".")
            module = getattr(torch, module_name.split(".")[1], None)
            if module is not None:
                self._patch(module, name, always(name))

        def collective(name):
            return lambda *args, **kwargs: ("async" if kwargs.get("async_op") else "collective", name)

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
        return [name for kind, name, lab in self.events if kind != "async" and (any_label or lab == label)]


# -- recording device placement -------------------------------------------------------------------------
def _upload_target(t: torch.Tensor, args: tuple, kwargs: dict) -> torch.device | None:
    """The device ``t.to(*args, **kwargs)`` places a host tensor on, or None when it is no upload: a
    non-CPU source, a dtype-only cast, or the host named as a string (``"cpu"``). As in
    :func:`_to_host`, a ``torch.device`` object stands for the run's device, so ``t.to(runtime.device)``
    is an upload even on a CPU run (where it returns ``t`` itself)."""
    if t.device.type != "cpu":
        return None
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.Tensor):
        target = target.device
    if isinstance(target, str):
        target = torch.device(target)
        return None if target.type == "cpu" else target
    return target if isinstance(target, torch.device) else None


class UploadRecorder:
    """Records every host tensor placed on a device while active (``Tensor.to`` with a device, see
    :func:`_upload_target`, and ``Tensor.cuda``), each as ``(source tensor, target, label)``.

    A CPU test cannot see an upload's cost, but it sees the call that on an accelerator copies: a test
    names a tensor (a batch's ``index`` as the model received it) and :meth:`uploads_of` says how often
    it was placed. The sources are held (identity, not ``id``), so use it on short runs, in one thread.
    """

    def __init__(self, label=lambda: None) -> None:
        self.label = label
        self.events: list[tuple[torch.Tensor, torch.device, object]] = []
        self._undo: list[tuple[str, object, bool]] = []

    def __enter__(self) -> Self:
        real_to, real_cuda = torch.Tensor.to, torch.Tensor.cuda
        self._undo = [
            (name, getattr(torch.Tensor, name), name in vars(torch.Tensor)) for name in ("to", "cuda")
        ]

        def to(t, *args, **kwargs):
            target = _upload_target(t, args, kwargs)
            if target is not None:
                self.events.append((t, target, self.label()))
            return real_to(t, *args, **kwargs)

        def cuda(t, device=None, *args, **kwargs):
            if t.device.type == "cpu":
                self.events.append((t, torch.device("cuda" if device is None else device), self.label()))
            return real_cuda(t, device, *args, **kwargs)

        torch.Tensor.to, torch.Tensor.cuda = to, cuda
        return self

    def __exit__(self, *exc) -> None:
        for name, real, own in self._undo:
            if own:  # another recorder's patch (a HostSyncCounter entered first): put it back
                setattr(torch.Tensor, name, real)
            else:  # inherited from torch's C base class: drop the override
                delattr(torch.Tensor, name)
        self._undo.clear()

    def uploads_of(self, tensor: torch.Tensor, label: object = None, *, any_label: bool = False) -> int:
        """How many times ``tensor`` itself (this object) was placed on a device under ``label``."""
        return sum(src is tensor and (any_label or lab == label) for src, _, lab in self.events)
