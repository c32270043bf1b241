"""FastWAM's cameras become one video as LeRobot 0.6.1 builds it (policies/fastwam/video.py).

The resize is checked against PIL's bilinear resize, an implementation of its own (torch's antialiased
bilinear with ``align_corners=False`` is designed to equal it), so a change of mode, antialiasing or
corner alignment fails here; tools/interop/fastwam_lerobot_interop.py compares the whole video with
LeRobot's own function.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lerobot_cli.policies.fastwam.video import (
    camera_keys,
    camera_size,
    inference_image,
    resize_frames,
    stack_video,
)
from PIL import Image


def pil_bilinear(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """One ``[H, W]`` float plane resized by PIL (``size`` is ``(H, W)``)."""
    return torch.from_numpy(
        np.array(Image.fromarray(image.numpy(), mode="F").resize(size[::-1], Image.BILINEAR))
    )


@pytest.mark.parametrize("size", [(8, 13), (12, 20)])
def test_frames_are_resized_as_pil_bilinear_does_with_any_leading_dims(size):
    g = torch.Generator().manual_seed(0)
    frames = torch.rand(2, 3, 3, 24, 40, generator=g)  # [B, T, C, H, W]
    out = resize_frames(frames, size)
    assert out.shape == (2, 3, 3, *size)
    for b, t, c in np.ndindex(2, 3, 3):
        torch.testing.assert_close(out[b, t, c], pil_bilinear(frames[b, t, c], size), atol=1e-5, rtol=0)


def test_frames_already_at_size_are_returned_as_they_are():
    frames = torch.rand(2, 3, 8, 12)
    assert resize_frames(frames, (8, 12)) is frames


def test_cameras_are_sorted_and_pad_masks_are_not_cameras():
    batch = {
        "observation.images.wrist": 0,
        "observation.images.top_is_pad": 0,
        "observation.images.top": 0,
        "observation.state": 0,
    }
    assert camera_keys(batch) == ["observation.images.top", "observation.images.wrist"]


def test_each_camera_gets_its_floor_share_of_the_width():
    assert camera_size((224, 448), 2) == (224, 224)
    assert camera_size((16, 50), 3) == (16, 16)
    with pytest.raises(ValueError, match="at least one camera"):
        camera_size((16, 48), 0)


def constant_camera(value: float, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.full(shape, value)


def test_a_temporal_stack_is_concatenated_along_the_width_in_key_order():
    # [B, T, C, H, W]: "top" 0.25 and "wrist" 0.75 at another resolution; each becomes half of the width
    batch = {
        "observation.images.wrist": constant_camera(0.75, (2, 5, 3, 20, 30)),
        "observation.images.top": constant_camera(0.25, (2, 5, 3, 16, 24)),
        "observation.images.top_is_pad": torch.zeros(2, 5, dtype=torch.bool),
    }
    video = stack_video(batch, image_size=(16, 48), model_video_frames=5)
    assert video.shape == (2, 3, 5, 16, 48)  # [B, C, T, H, W]
    torch.testing.assert_close(video[..., :24], torch.full((2, 3, 5, 16, 24), 0.25))
    torch.testing.assert_close(video[..., 24:], torch.full((2, 3, 5, 16, 24), 0.75), atol=1e-6, rtol=0)


def test_time_moves_behind_the_channels():
    frames = torch.rand(2, 5, 3, 16, 24)
    video = stack_video({"observation.images.top": frames}, image_size=(16, 24), model_video_frames=5)
    for t in range(5):
        assert torch.equal(video[:, :, t], frames[:, t])


def test_a_single_frame_is_repeated_over_the_model_frames():
    frame = torch.rand(2, 3, 16, 24)
    video = stack_video({"observation.images.top": frame}, image_size=(16, 24), model_video_frames=9)
    assert video.shape == (2, 3, 9, 16, 24)
    for t in range(9):
        assert torch.equal(video[:, :, t], frame)


def test_a_batch_without_cameras_or_with_odd_ranks_is_refused():
    with pytest.raises(KeyError, match="observation.images"):
        stack_video({"observation.state": torch.zeros(2, 3)}, image_size=(16, 24), model_video_frames=5)
    with pytest.raises(ValueError, match="Expected image batch"):
        stack_video(
            {"observation.images.top": torch.zeros(3, 16, 24)}, image_size=(16, 24), model_video_frames=5
        )


def test_inference_conditions_on_the_first_frame_at_full_size():
    frames = torch.rand(2, 5, 3, 16, 24)
    batch = {"observation.images.top": frames}
    image = inference_image(batch, image_size=(16, 24), model_video_frames=5)
    assert torch.equal(image, frames[:, 0])
    # an explicit input_image wins, and is resized to the full image_size
    image = inference_image(
        {**batch, "input_image": torch.rand(3, 32, 48)}, image_size=(16, 24), model_video_frames=5
    )
    assert image.shape == (1, 3, 16, 24)
