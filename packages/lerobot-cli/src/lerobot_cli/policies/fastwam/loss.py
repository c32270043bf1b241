"""FastWAM's training targets and its two flow-matching losses (video latents and actions).

One training step draws, in this order, the video noise, the video timesteps, the action noise and the
action timesteps (LeRobot 0.6.1's order, so a seeded step gives LeRobot's numbers). The first latent frame
is the conditioning image: with ``fuse_first_frame`` it is put back clean into the noisy latents and left out
of the video loss (the model sees it at timestep 0 through the first-frame-causal mask instead).

Each loss is a per-sample mean squared error in float32, masked where the batch marks padding, weighted by
the schedule's per-sample weight of the sample's timestep, then averaged over the batch. The video loss can
mask latent frames whose every source frame is padding (``image_is_pad``, 4 frames per latent step after the
first); LeRobot's policy never passes that mask from a dataset batch, and neither does ours, so padded
frames at an episode's end are supervised as LeRobot supervises them. ``action_is_pad`` does mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attrs import frozen
from torch import Tensor

from lerobot_cli.policies.fastwam.schedule import FlowSchedule


@frozen
class FlowTargets:
    """One step's noisy inputs, regression targets and timesteps for both experts."""

    latents: Tensor
    target_video: Tensor
    timestep_video: Tensor
    noisy_action: Tensor
    target_action: Tensor
    timestep_action: Tensor


def draw_targets(
    latents: Tensor, action: Tensor, video: FlowSchedule, actions: FlowSchedule, fuse_first_frame: bool
) -> FlowTargets:
    """Noise both streams at independently drawn timesteps (``latents``: ``[B, C, T, H, W]``)."""
    batch = latents.shape[0]
    noise_video = torch.randn_like(latents)
    timestep_video = video.sample_timesteps(batch, latents.device, latents.dtype)
    noisy_latents = video.noisy(latents, noise_video, timestep_video)
    target_video = video.velocity(latents, noise_video)
    if fuse_first_frame:
        noisy_latents[:, :, 0:1] = latents[:, :, 0:1]
    noise_action = torch.randn_like(action)
    timestep_action = actions.sample_timesteps(batch, action.device, action.dtype)
    return FlowTargets(
        latents=noisy_latents,
        target_video=target_video,
        timestep_video=timestep_video,
        noisy_action=actions.noisy(action, noise_action, timestep_action),
        target_action=actions.velocity(action, noise_action),
        timestep_action=timestep_action,
    )


def _masked_mean(per_step: Tensor, is_pad: Tensor | None) -> Tensor:
    """Mean over dim 1 of ``per_step`` ``[B, S]``, counting only steps not marked as padding."""
    if is_pad is None:
        return per_step.mean(dim=1)
    valid = (~is_pad).to(device=per_step.device, dtype=per_step.dtype)
    return (per_step * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1.0)


def latent_step_padding(image_is_pad: Tensor, temporal_factor: int, include_first: bool) -> Tensor:
    """Frame padding ``[B, T]`` → latent-step padding: a step after the first is padding when all its
    ``temporal_factor`` frames are; the first frame is its own step (kept only when ``include_first``)."""
    if image_is_pad.shape[1] < 1 or (image_is_pad.shape[1] - 1) % temporal_factor:
        raise ValueError(
            f"image_is_pad has {image_is_pad.shape[1]} frames; FastWAM needs 1 + a multiple of "
            f"{temporal_factor}"
        )
    tail = image_is_pad[:, 1:].reshape(image_is_pad.shape[0], -1, temporal_factor).all(dim=2)
    return torch.cat([image_is_pad[:, :1], tail], dim=1) if include_first else tail


def video_loss(
    pred: Tensor,
    target: Tensor,
    timestep: Tensor,
    schedule: FlowSchedule,
    fuse_first_frame: bool,
    image_is_pad: Tensor | None = None,
    temporal_factor: int = 4,
) -> Tensor:
    """Weighted flow-matching loss on the video latents ``[B, C, T, H, W]`` (the first frame left out when
    it was fused as the clean condition)."""
    if fuse_first_frame:
        pred, target = pred[:, :, 1:], target[:, :, 1:]
    per_step = F.mse_loss(pred.float(), target.float(), reduction="none").mean(dim=(1, 3, 4))
    is_pad = None
    if image_is_pad is not None:
        is_pad = latent_step_padding(image_is_pad, temporal_factor, include_first=not fuse_first_frame)
        if is_pad.shape[1] != per_step.shape[1]:
            raise ValueError(
                f"image_is_pad covers {is_pad.shape[1]} latent steps, the video loss has {per_step.shape[1]}"
            )
    per_sample = _masked_mean(per_step, is_pad)
    return (per_sample * schedule.weight(timestep).to(per_sample.device, dtype=per_sample.dtype)).mean()


def action_loss(
    pred: Tensor,
    target: Tensor,
    timestep: Tensor,
    schedule: FlowSchedule,
    action_is_pad: Tensor | None = None,
) -> Tensor:
    """Weighted flow-matching loss on the action chunk ``[B, H, A]``; padded steps do not count."""
    per_step = F.mse_loss(pred.float(), target.float(), reduction="none").mean(dim=2)
    per_sample = _masked_mean(per_step, action_is_pad)
    return (per_sample * schedule.weight(timestep).to(per_sample.device, dtype=per_sample.dtype)).mean()
