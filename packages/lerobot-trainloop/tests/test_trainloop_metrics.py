"""Meters and the single-process path of the reduction (the cross-rank path runs in
tests/test_engine_multiproc.py on real gloo ranks)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from lerobot_trainloop.batch import batch_size_of, move_to_device
from lerobot_trainloop.metrics import Meter, MetricsTracker, _reduce_column


def test_meter_window_mean_and_reset():
    m = Meter("max")
    assert math.isnan(m.value)
    for v in (1.0, 2.0, 6.0):
        m.update(v)
    assert m.value == 3.0
    m.reset()
    assert m.count == 0 and math.isnan(m.value)
    with pytest.raises(ValueError, match="reduction"):
        Meter("median")


def test_world_one_reduce_is_local_and_needs_no_process_group():
    assert not dist.is_initialized()
    t = MetricsTracker({"loss": "mean", "step_s": "max"})
    t.update("loss", 2.0)
    t.update("loss", 4.0)
    t.update("extra", 1.5)  # created on first use with the default reduction
    reduced = t.reduce(world_size=1)
    assert reduced.keys() == {"extra", "loss", "step_s"}
    assert (reduced["extra"], reduced["loss"]) == (1.5, 3.0)
    assert math.isnan(reduced["step_s"]) and math.isnan(t.local()["step_s"])
    assert t.meters["extra"].reduction == "mean"


def test_declared_reduction_cannot_change():
    t = MetricsTracker({"step_s": "max"})
    t.declare("step_s", "max")
    with pytest.raises(ValueError, match="already reduces"):
        t.declare("step_s", "mean")


@pytest.mark.parametrize("how,expected", [("mean", 2.0), ("max", 3.0), ("min", 1.0), ("sum", 4.0)])
def test_column_reductions_ignore_nan(how, expected):
    assert _reduce_column([1.0, float("nan"), 3.0], how) == expected
    assert math.isnan(_reduce_column([float("nan")] * 2, how))


def test_tensor_values_stay_on_the_device_until_the_window_is_read():
    """Tensors are summed as tensors (no read at update), mixed with host numbers in one meter,
    and the window is read once, by pack + tolist."""
    t = MetricsTracker({"loss": "mean"})
    for v in (1.0, 2.0):
        t.update("loss", torch.tensor(v, requires_grad=True) * 1)  # detached by the meter
    t.update("loss", 6.0)
    t.update("grad_norm", torch.tensor([4.0]), reduction="local")
    meter = t.meters["loss"]
    assert isinstance(meter.device_total, torch.Tensor) and not meter.device_total.requires_grad
    assert meter.device_total.dtype == torch.float64 and meter.total == 6.0 and meter.count == 3
    packed = t.pack("cpu")
    assert packed.dtype == torch.float64 and packed.shape == (3,)
    assert t.reduce(world_size=1) == {"grad_norm": 4.0, "loss": 3.0}
    assert meter.value == 3.0
    with pytest.raises(ValueError, match="one number per update"):
        t.update("loss", torch.ones(2))
    t.reset()
    assert meter.device_total is None and math.isnan(meter.value)


def test_batch_helpers():
    batch = {"obs": {"img": torch.zeros(5, 3)}, "task": ["a"] * 5, "n": 3}
    moved = move_to_device(batch, torch.device("cpu"))
    assert moved["obs"]["img"].shape == (5, 3) and moved["task"] == ["a"] * 5 and moved["n"] == 3
    assert batch_size_of(batch) == 5 and batch_size_of((torch.tensor(1.0), [torch.ones(2, 1)])) == 2
    assert batch_size_of({"x": "no tensor"}) is None
