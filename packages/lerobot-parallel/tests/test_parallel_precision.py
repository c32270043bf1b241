"""Mixed precision on CPU: autocast dtypes, fp32 parameters, fp16 scaler skip detection."""

from __future__ import annotations

import pytest
import torch
from lerobot_parallel.precision import build_precision


class Probe(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.seen: torch.dtype | None = None

    def forward(self, x):
        y = self.lin(x)
        self.seen = y.dtype
        return y.float().pow(2).mean()


@pytest.mark.parametrize(
    "mode,dtype", [("no", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_autocast_dtype_and_fp32_params(mode, dtype):
    model, precision = Probe(), build_precision(mode, "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with precision.autocast():
        loss = model(torch.randn(2, 4))
    assert model.seen == dtype
    precision.backward(loss)
    assert precision.step(opt) is True
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert (precision.scaler is not None) is (mode == "fp16")


def test_fp16_scaler_reports_a_skipped_step_and_leaves_weights():
    model = Probe()
    precision = build_precision("fp16", "cpu", init_scale=2.0**40, backoff_factor=2.0**-32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    with precision.autocast():
        loss = model(torch.randn(2, 4) * 100)
    precision.backward(loss)  # 2**40 x loss overflows fp16 gradients
    precision.unscale_(opt)
    assert precision.step(opt) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert precision.scaler.get_scale() == 2.0**8
    opt.zero_grad()
    with precision.autocast():
        loss = model(torch.randn(2, 4))
    precision.backward(loss)
    assert precision.step(opt) is True  # a sane scale steps again
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_scaler_state_round_trip():
    a = build_precision("fp16", "cpu", init_scale=1024.0)
    b = build_precision("fp16", "cpu")
    b.load_state_dict(a.state_dict())
    assert b.scaler.get_scale() == 1024.0
    assert build_precision("bf16", "cpu").state_dict() == {}


def test_unknown_mode_rejected():
    with pytest.raises(ValueError, match="mixed_precision"):
        build_precision("fp8", "cpu")
