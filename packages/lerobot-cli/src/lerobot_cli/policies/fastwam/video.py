"""FastWAM's camera frames as one video: every camera resized to its share of the width, side by side.

LeRobot 0.6.1's FastWAM model owns its input resolution (its pre-processor has no resize step, so a
fine-tuned checkpoint never inherits another dataset's camera geometry): each camera is resized to
``(image_size[0], image_size[1] // n_cameras)`` and the cameras are concatenated along the width, in
sorted key order. The arithmetic is LeRobot's (bilinear, antialiased, ``align_corners=False``, skipped
when a frame already has the size), so the same frames give the same video bit for bit.

- training: ``observation.images.*`` at the delta indices ``[B, T, C, H, W]`` → ``video [B, C, T, H, W]``;
- one live frame ``[B, C, H, W]`` → repeated over ``model_video_frames``;
- inference: the first frame of that video, resized to the full ``image_size`` (a no-op here).

The functions take ``image_size`` / ``model_video_frames`` rather than the policy config, so they do not
depend on it (``model_video_frames = (num_video_frames - 1) // action_video_freq_ratio + 1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

IMAGE_PREFIX = "observation.images."
PAD_SUFFIX = "_is_pad"


def resize_frames(frames: Tensor, size: Sequence[int]) -> Tensor:
    """``frames [..., C, H, W]`` resized to ``size = (H', W')`` (any number of leading dims: batch, time).

    ``interpolate`` takes one leading batch dim, so the leading dims are flattened and restored.
    Unchanged (the same tensor) when the frames already have the size.
    """
    size = (int(size[0]), int(size[1]))
    if tuple(frames.shape[-2:]) == size:
        return frames
    lead = frames.shape[:-3]
    flat = frames.reshape(-1, *frames.shape[-3:])
    flat = torch.nn.functional.interpolate(
        flat, size=size, mode="bilinear", align_corners=False, antialias=True
    )
    return flat.reshape(*lead, *flat.shape[-3:])


def camera_keys(batch: Mapping[str, Any]) -> list[str]:
    """The batch's camera keys in the order they are concatenated: sorted, without the ``*_is_pad``
    masks that delta-timestamp loading adds under the same prefix."""
    return sorted(k for k in batch if k.startswith(IMAGE_PREFIX) and not k.endswith(PAD_SUFFIX))


def camera_size(image_size: Sequence[int], n_cameras: int) -> tuple[int, int]:
    """One camera's ``(H, W)``: the full height, the width split evenly (floor) between the cameras."""
    if n_cameras < 1:
        raise ValueError(f"FastWAM needs at least one camera, got {n_cameras}")
    return int(image_size[0]), int(image_size[1]) // n_cameras


def stack_video(batch: Mapping[str, Any], *, image_size: Sequence[int], model_video_frames: int) -> Tensor:
    """The model's video ``[B, C, T, H, W]`` from the batch's ``observation.images.*``.

    A temporal stack ``[B, T, C, H, W]`` keeps its frames; a single frame ``[B, C, H, W]`` (a live
    observation) is repeated ``model_video_frames`` times.
    """
    keys = camera_keys(batch)
    if not keys:
        raise KeyError("FastWAM batch must contain `video` or `observation.images.*` keys.")
    size = camera_size(image_size, len(keys))
    frames = [resize_frames(batch[key], size) for key in keys]
    image = torch.cat(frames, dim=-1) if len(frames) > 1 else frames[0]
    if image.ndim == 4:
        return image.unsqueeze(2).repeat(1, 1, int(model_video_frames), 1, 1)
    if image.ndim == 5:
        return image.permute(0, 2, 1, 3, 4)
    raise ValueError(f"Expected image batch [B,C,H,W] or temporal [B,T,C,H,W], got {tuple(image.shape)}.")


def full_size_image(image: Tensor, image_size: Sequence[int]) -> Tensor:
    """An inference image ``[B, C, H, W]`` (or ``[C, H, W]``) at the full ``image_size``."""
    if image.ndim == 3:
        image = image.unsqueeze(0)
    if image.ndim != 4:
        raise ValueError(f"Expected image tensor [B,C,H,W] or [C,H,W], got {tuple(image.shape)}.")
    return resize_frames(image, image_size)


def inference_image(
    batch: Mapping[str, Any], *, image_size: Sequence[int], model_video_frames: int
) -> Tensor:
    """The conditioning frame of one inference call, ``[B, C, H, W]``: ``input_image`` when the batch has
    one, else the first frame of ``video`` (or of the video built from the cameras)."""
    if "input_image" in batch:
        return full_size_image(batch["input_image"], image_size)
    video = batch.get("video")
    if video is None:
        video = stack_video(batch, image_size=image_size, model_video_frames=model_video_frames)
    if video.ndim == 5:
        return full_size_image(video[:, :, 0], image_size)
    if video.ndim == 4:
        return full_size_image(video, image_size)
    raise ValueError(f"Cannot build input image from tensor with shape {tuple(video.shape)}.")
