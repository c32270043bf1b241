"""HostSyncCounter counts every kind of host read it claims, once each, on CPU (where the no-sync tests
run): the reads a CUDA run would wait on, named as the counter names them, and none of the calls that
only look like reads (an upload to the run's device, a dtype cast, plain or integer indexing, a
three-argument ``torch.where``). A copy from another device is shown with ``meta`` tensors: the call
fails after the counter saw it (there is no data to copy), which is all the check needs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lerobot_trainloop.testing import HostSyncCounter

T = torch.arange(6.0)
MASK = T > 2
ONE = torch.tensor(3.0)

READS = {
    "item": (lambda: ONE.item(), ["item"]),
    "float": (lambda: float(ONE), ["__float__"]),  # float() calls item(): once
    "int": (lambda: int(ONE), ["__int__"]),
    "bool": (lambda: bool(ONE > 1), ["__bool__"]),
    "if": (lambda: 1 if ONE else 0, ["__bool__"]),
    "index": (lambda: [0, 1, 2, 3][torch.tensor(1)], ["__index__"]),
    "tolist": (lambda: T.tolist(), ["tolist"]),
    "numpy": (lambda: T.numpy(), ["numpy"]),
    "np.asarray": (lambda: np.asarray(T), ["numpy"]),
    "format": (lambda: f"{ONE:.3f}", ["item"]),
    "cpu": (lambda: T.cpu(), ["cpu"]),
    "to('cpu')": (lambda: T.to("cpu"), ["to_cpu"]),
    "to(device='cpu')": (lambda: T.to(device="cpu", dtype=torch.float64), ["to_cpu"]),
    "nonzero": (lambda: T.nonzero(), ["nonzero"]),
    "torch.nonzero": (lambda: torch.nonzero(T), ["nonzero"]),
    "argwhere": (lambda: torch.argwhere(T), ["argwhere"]),
    "where(cond)": (lambda: torch.where(MASK), ["where"]),
    "masked_select": (lambda: T.masked_select(MASK), ["masked_select"]),
    "unique": (lambda: T.unique(), ["unique"]),
    "mask index": (lambda: T[MASK], ["mask_index"]),
    "mask in a tuple": (lambda: T.view(2, 3)[:, MASK[:3]], ["mask_index"]),
    "mask assign": (lambda: T.clone().__setitem__(MASK, 0.0), ["mask_assign"]),
    "equal": (lambda: torch.equal(T, T), ["equal"]),
    "allclose": (lambda: T.allclose(T), ["allclose"]),
}

NOT_READS = {
    "upload to the run's device": lambda: T.to(torch.device("cpu")),
    "non-blocking to cpu": lambda: T.to("cpu", non_blocking=True),
    "dtype cast": lambda: T.to(torch.float64),
    "copy on the host": lambda: torch.empty(6).copy_(T),
    "integer index": lambda: T[torch.tensor([0, 2])],
    "slice": lambda: T[1:3],
    "masked_fill": lambda: T.masked_fill(MASK, 0.0),
    "where(cond, a, b)": lambda: torch.where(MASK, T, 0.0),
    "arithmetic": lambda: (T * 2).sum(),
}


@pytest.mark.parametrize("case", sorted(READS))
def test_every_read_is_counted_once(case):
    fn, expected = READS[case]
    with HostSyncCounter(label=lambda: "here") as counter:
        fn()
    assert counter.syncs("here") == expected


@pytest.mark.parametrize("case", sorted(NOT_READS))
def test_what_only_looks_like_a_read_is_not_counted(case):
    with HostSyncCounter() as counter:
        NOT_READS[case]()
    assert counter.events == []


@pytest.mark.parametrize(("case", "expected"), [("copy", "copy_to_host"), ("to", "to_cpu"), ("cpu", "cpu")])
def test_a_download_from_another_device_is_counted(case, expected):
    """``meta`` stands for an accelerator: the counter records the call, then torch refuses it (no data)."""
    device_tensor = torch.ones(3, device="meta")
    with HostSyncCounter() as counter:
        try:
            {
                "copy": lambda: torch.zeros(3).copy_(device_tensor),
                "to": lambda: device_tensor.to(torch.device("cpu")),
                "cpu": lambda: device_tensor.cpu(),
            }[case]()
        except NotImplementedError:
            pass
    assert counter.syncs() == [expected]
    with HostSyncCounter() as counter:
        try:
            torch.zeros(3).copy_(device_tensor, non_blocking=True)
        except NotImplementedError:
            pass
    assert counter.events == []


def test_collectives_are_counted_and_everything_is_restored_after():
    import torch.distributed as dist

    before = {name: getattr(torch.Tensor, name) for name in ("item", "__getitem__", "copy_", "to", "unique")}
    where, barrier = torch.where, dist.barrier
    with HostSyncCounter() as counter:
        for call in (lambda: dist.barrier(), lambda: dist.all_reduce(ONE, async_op=True)):
            try:
                call()
            except (RuntimeError, ValueError):  # no process group in this process
                pass
    assert [e[:2] for e in counter.events] == [("collective", "barrier"), ("async", "all_reduce")]
    assert counter.syncs() == ["barrier"]
    assert {name: getattr(torch.Tensor, name) for name in before} == before
    assert torch.where is where and dist.barrier is barrier
    assert "__getitem__" not in vars(torch.Tensor) and "item" not in vars(torch.Tensor)
