"""LR schedules: LeRobot's formulas for both types, and its rule that fits a long preset into a short run."""

from __future__ import annotations

import math

import pytest
import torch
from lerobot_cli.optim.config import SchedulerConfig
from lerobot_cli.optim.factory import build_scheduler


def lrs(cfg: SchedulerConfig, base_lr: float, total_steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base_lr)
    sched = build_scheduler(cfg, opt, total_steps)
    out = []
    for _ in range(total_steps + 2):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_pi0_preset_is_fitted_into_a_short_run_as_lerobot_does():
    # 1,000 warm-up + 30,000 decay steps, run for 3,000: warm-up 100, decay over the 3,000.
    cfg = SchedulerConfig(num_warmup_steps=1000, num_decay_steps=30_000, peak_lr=2.5e-5, decay_lr=2.5e-6)
    assert cfg.fitted_steps(3000) == (100, 3000)
    assert cfg.fitted_steps(40_000) == (1000, 30_000)
    got = lrs(cfg, 2.5e-5, 3000)
    assert got[0] == pytest.approx(2.5e-5 / 101)  # warm-up starts at 1/(W+1) of the peak
    assert got[50] == pytest.approx(2.5e-5 * ((1 / 101 - 1) * 0.5 + 1))
    # After warm-up the cosine runs as if from step 0 (LeRobot's formula), reaching decay_lr at the end.
    cosine = 0.5 * (1 + math.cos(math.pi * 1500 / 3000))
    assert got[1500] == pytest.approx(2.5e-5 * ((1 - 0.1) * cosine + 0.1))
    assert got[3000] == pytest.approx(2.5e-6) and got[3001] == pytest.approx(2.5e-6)


def test_constant_with_warmup_ramps_from_zero():
    got = lrs(SchedulerConfig(type="constant_with_warmup", num_warmup_steps=4), 1e-3, 8)
    assert got[:6] == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])


def test_peak_lr_scales_every_group_relative_to_its_own_lr():
    cfg = SchedulerConfig(num_warmup_steps=0, num_decay_steps=10, peak_lr=2e-3, decay_lr=0.0)
    assert lrs(cfg, 1e-3, 10)[0] == pytest.approx(2e-3)
    assert lrs(cfg, 1e-3, 10)[10] == pytest.approx(0.0, abs=1e-12)


def test_diffuser_cosine_is_diffusers_get_scheduler_cosine():
    """diffusers' get_cosine_schedule_with_warmup (num_cycles 0.5), written out:
    LeRobot's diffusion preset."""
    warmup, total = 5, 20

    def diffusers(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))

    got = lrs(SchedulerConfig(type="diffuser_cosine", num_warmup_steps=warmup), 1e-4, total)
    assert got == pytest.approx([1e-4 * diffusers(s) for s in range(total + 2)], rel=1e-12, abs=0)
    assert got[0] == 0.0 and got[warmup] == pytest.approx(1e-4) and got[total] == 0.0
