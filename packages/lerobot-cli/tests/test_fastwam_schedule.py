"""FastWAM's shifted flow-matching schedule: the warp, the normalised weights, noising and the Euler grid.

Bit equality with LeRobot 0.6.1's scheduler is checked in LeRobot's environment by
``tools/interop/fastwam_schedule_lerobot_interop.py``; these tests pin the properties that make the numbers
right on their own.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lerobot_cli.policies.fastwam.schedule import FlowSchedule, shifted_sigmas


@pytest.mark.parametrize("shift", [1.0, 3.0, 5.0])
def test_weights_are_zero_at_the_least_and_one_on_average_over_the_grid(shift):
    schedule = FlowSchedule(1000, shift)
    grid = torch.as_tensor(np.linspace(1.0, 0.0, 1001)[:-1])
    t = shift * grid / (1 + (shift - 1) * grid) * 1000
    weights = schedule.weight(t).double()
    assert weights.min().item() == pytest.approx(0.0, abs=1e-6)
    assert weights.mean().item() == pytest.approx(1.0, abs=1e-5)
    # A bell centred on N/2: the middle weighs most.
    assert schedule.weight(torch.tensor([500.0])).item() > schedule.weight(torch.tensor([900.0])).item()
    assert schedule.weight(torch.tensor([500.0])).shape == ()


def test_training_timesteps_are_the_shifted_uniform_draw():
    schedule = FlowSchedule(1000, 5.0)
    torch.manual_seed(3)
    t = schedule.sample_timesteps(64, "cpu", torch.float32)
    torch.manual_seed(3)
    u = torch.rand(64)
    assert torch.equal(t, 5.0 * u / (1 + 4.0 * u) * 1000)
    assert t.min() >= 0 and t.max() < 1000
    # The shift pushes draws towards noise: well above half of them lie above N/2 (a plain draw: half).
    assert (t > 500).float().mean() > 0.7
    assert schedule.sample_timesteps(4, "cpu", torch.bfloat16).dtype == torch.bfloat16


def test_noising_interpolates_per_sample_and_the_target_is_the_velocity():
    schedule = FlowSchedule(1000, 5.0)
    clean, noise = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    mixed = schedule.noisy(clean, noise, torch.tensor([0.0, 1000.0, 250.0]))
    assert torch.equal(mixed[0], clean[0]) and torch.equal(mixed[1], noise[1])
    assert torch.allclose(mixed[2], 0.75 * clean[2] + 0.25 * noise[2])
    assert torch.equal(schedule.velocity(clean, noise), noise - clean)


def test_the_euler_grid_runs_from_pure_noise_to_clean_data():
    schedule = FlowSchedule(1000, 5.0)
    timesteps, deltas = schedule.inference_steps(10, "cpu", torch.float32)
    assert timesteps[0].item() == 1000.0 and torch.all(timesteps[1:] < timesteps[:-1])
    assert deltas.sum().item() == pytest.approx(-1.0, abs=1e-6)
    assert torch.allclose(timesteps / 1000, torch.as_tensor(shifted_sigmas(10, 5.0), dtype=torch.float32))
    # Integrating the exact velocity of a straight path from noise lands on the clean sample.
    clean, noise = torch.randn(2, 3), torch.randn(2, 3)
    sample = noise
    for delta in deltas:
        sample = schedule.euler(schedule.velocity(clean, noise), delta, sample)
    assert torch.allclose(sample, clean, atol=1e-5)
    override, _ = schedule.inference_steps(10, "cpu", torch.float32, shift=1.0)
    assert torch.allclose(override / 1000, torch.linspace(1, 0, 11)[:10].float(), atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_train_timesteps": 0}, "num_train_timesteps must be positive"),
        ({"shift": -1.0}, "shift must be positive"),
    ],
)
def test_bad_schedules_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FlowSchedule(**kwargs)
    with pytest.raises(ValueError, match="num_inference_steps must be positive"):
        FlowSchedule().inference_steps(0, "cpu", torch.float32)
