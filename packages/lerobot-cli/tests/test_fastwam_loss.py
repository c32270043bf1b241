"""FastWAM's training targets and losses: what is noised, what is left out, what padding masks.

Bit equality with LeRobot 0.6.1 (same seeds, both dtypes):
``tools/interop/fastwam_flow_lerobot_interop.py``.
"""

from __future__ import annotations

import pytest
import torch
from lerobot_cli.policies.fastwam.loss import action_loss, draw_targets, latent_step_padding, video_loss
from lerobot_cli.policies.fastwam.schedule import FlowSchedule

SCHEDULE = FlowSchedule(1000, 5.0)


def _batch():
    torch.manual_seed(0)
    return torch.randn(2, 4, 3, 2, 2), torch.randn(2, 8, 3)


@pytest.mark.parametrize("fuse", [True, False])
def test_targets_noise_both_streams_and_keep_the_fused_first_frame_clean(fuse):
    latents, action = _batch()
    targets = draw_targets(latents, action, SCHEDULE, SCHEDULE, fuse_first_frame=fuse)
    noise = targets.target_video + latents
    sigma = (targets.timestep_video / 1000).view(-1, 1, 1, 1, 1)
    expected = (1 - sigma) * latents + sigma * noise
    assert torch.allclose(targets.latents[:, :, 1:], expected[:, :, 1:], atol=1e-5)
    first = targets.latents[:, :, :1]
    assert (
        torch.equal(first, latents[:, :, :1])
        if fuse
        else torch.allclose(first, expected[:, :, :1], atol=1e-5)
    )
    action_noise = targets.target_action + action
    action_sigma = (targets.timestep_action / 1000).view(-1, 1, 1)
    assert torch.allclose(
        targets.noisy_action, (1 - action_sigma) * action + action_sigma * action_noise, atol=1e-5
    )
    # Independent timesteps per stream and per sample.
    assert not torch.equal(targets.timestep_video, targets.timestep_action)
    assert targets.timestep_video[0] != targets.timestep_video[1]


def test_the_video_loss_leaves_out_the_fused_first_frame_and_weighs_each_sample():
    latents, _ = _batch()
    target, timestep = torch.randn_like(latents), torch.tensor([100.0, 600.0])
    pred = torch.randn_like(latents)
    changed = pred.clone()
    changed[:, :, 0] += 5
    assert video_loss(changed, target, timestep, SCHEDULE, True) == video_loss(
        pred, target, timestep, SCHEDULE, True
    )
    assert video_loss(changed, target, timestep, SCHEDULE, False) != video_loss(
        pred, target, timestep, SCHEDULE, False
    )
    per_sample = ((pred - target)[:, :, 1:] ** 2).mean(dim=(1, 2, 3, 4))
    expected = (per_sample * SCHEDULE.weight(timestep)).mean()
    assert torch.allclose(video_loss(pred, target, timestep, SCHEDULE, True), expected)


def test_padding_masks_the_action_steps_and_the_latent_steps_it_covers():
    _, action = _batch()
    target, timestep = torch.randn_like(action), torch.tensor([300.0, 700.0])
    pred = torch.randn_like(action)
    is_pad = torch.zeros(2, 8, dtype=torch.bool)
    is_pad[0, 5:] = True
    is_pad[1, :] = True
    changed = pred.clone()
    changed[0, 5:] += 3
    changed[1] += 3
    masked = action_loss(pred, target, timestep, SCHEDULE, is_pad)
    assert action_loss(changed, target, timestep, SCHEDULE, is_pad) == masked
    assert action_loss(changed, target, timestep, SCHEDULE) != action_loss(pred, target, timestep, SCHEDULE)
    # A fully padded sample counts zero, not NaN; the other is the mean over its 5 real steps.
    first = ((pred[0, :5] - target[0, :5]) ** 2).mean() * SCHEDULE.weight(timestep[:1])
    assert torch.allclose(masked, first / 2)

    frames = torch.zeros(2, 9, dtype=torch.bool)
    frames[0, 4:] = True  # frames 4..8: step 1 (frames 1-4) keeps a real frame, step 2 (5-8) is all padding
    assert latent_step_padding(frames, 4, include_first=False).tolist() == [[False, True], [False, False]]
    assert latent_step_padding(frames, 4, include_first=True).shape == (2, 3)
    with pytest.raises(ValueError, match="1 \\+ a multiple of 4"):
        latent_step_padding(torch.zeros(2, 8, dtype=torch.bool), 4, include_first=False)
