"""``--dataset.use_imagenet_stats``: the cameras' mean and std replaced by ImageNet's, LeRobot's default.

LeRobot 0.6.1's dataset factory (``lerobot/datasets/factory.py``, ``make_dataset``) overwrites, when
``dataset.use_imagenet_stats`` is true (its default), the ``mean`` and ``std`` of every camera feature's
statistics with ImageNet's, before the policy's processors are built from them. The other statistics of a
camera (``min``, ``max``, ``count``, quantiles) stay the dataset's, and depth maps keep theirs. A
pretrained ImageNet backbone (ACT's and Diffusion's default ResNet18) then sees inputs normalised as in its
pretraining, and a policy trained here saves the same normaliser as one trained by LeRobot on the same
dataset. Torch-free: the CLI's config tree imports this module's neighbours.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lerobot_cli.datasets import layout as L

# LeRobot's IMAGENET_STATS (lerobot/utils/constants.py), shaped (C, 1, 1) like a camera's stats.json entry
IMAGENET_STATS: dict[str, list[list[list[float]]]] = {
    "mean": [[[0.485]], [[0.456]], [[0.406]]],
    "std": [[[0.229]], [[0.224]], [[0.225]]],
}


def is_depth_map(feature: Mapping) -> bool:
    """LeRobot's ``depth_keys`` rule: ``info.is_depth_map``, or the legacy ``video.is_depth_map`` in
    ``info`` or ``video_info``."""
    info, video_info = feature.get("info") or {}, feature.get("video_info") or {}
    return bool(
        info.get("is_depth_map") or info.get("video.is_depth_map") or video_info.get("video.is_depth_map")
    )


def imagenet_camera_keys(features: Mapping[str, Mapping]) -> list[str]:
    """The features whose mean/std ImageNet's replace: every image or video feature that is no depth map."""
    return [k for k, f in features.items() if f.get("dtype") in L.VISUAL_DTYPES and not is_depth_map(f)]


def with_imagenet_stats(
    stats: Mapping[str, Mapping[str, np.ndarray]], features: Mapping[str, Mapping]
) -> dict[str, dict[str, np.ndarray]]:
    """A copy of ``stats`` with ImageNet's ``mean`` and ``std`` (float32, ``(3, 1, 1)``) for each camera of
    ``features`` (:func:`imagenet_camera_keys`); every other statistic and feature unchanged. ``stats``
    itself is left as it is (the dataset's metadata is shared). A camera without statistics gets these two
    (LeRobot stops on a ``KeyError`` there)."""
    out = {key: dict(per_stat) for key, per_stat in stats.items()}
    for key in imagenet_camera_keys(features):
        entry = out.setdefault(key, {})
        for name, value in IMAGENET_STATS.items():
            entry[name] = np.asarray(value, dtype=np.float32)
    return out
