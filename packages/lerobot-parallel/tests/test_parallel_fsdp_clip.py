"""Clipping on plain gradients equals torch's; sharded (DTensor) and mixed gradients are checked
against single-process runs in tests/test_fsdp_multiproc.py."""

from __future__ import annotations

import math

import pytest
import torch
from lerobot_parallel.grad_clip import clip_grad_norm, total_grad_norm


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model(torch.randn(4, 5)).pow(2).sum().backward()
    return model


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.01, 1e6])
def test_matches_torch_clip_grad_norm(norm_type, max_norm):
    ours, theirs = _model(), _model()
    got = clip_grad_norm(ours.parameters(), max_norm, norm_type)
    want = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm, norm_type)
    assert not hasattr(got, "placements") and got.dim() == 0
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=0)
    if max_norm < float(want):
        assert float(total_grad_norm(ours.parameters(), norm_type)) == pytest.approx(max_norm, rel=1e-4)


def test_parameters_without_gradients_are_skipped():
    model = _model()
    frozen = torch.nn.Parameter(torch.ones(3))
    assert float(clip_grad_norm([*model.parameters(), frozen], 1e6)) == pytest.approx(
        float(total_grad_norm(model.parameters()))
    )
    assert float(total_grad_norm([frozen])) == 0.0
