"""An env's observation batch as a policy's input batch: LeRobot 0.6.1's ``preprocess_observation``
(``lerobot.envs.utils``), the same keys, dtypes and arithmetic, so a policy sees bit for bit what it would
in LeRobot's rollout.

- ``pixels``: one camera (an array) -> ``observation.image``; several (a dict) ->
  ``observation.images.<name>``; uint8 HWC -> float32 CHW in [0, 1] (``float32(x) / 255``, in place, as
  LeRobot divides).
- ``environment_state`` -> ``observation.environment_state``, ``agent_pos`` -> ``observation.state``, both
  float32.
- ``robot_state`` (nested dict, arrays as tensors), ``policy`` and ``camera_obs`` (IsaacLab Arena) under
  ``observation.<key>`` as LeRobot passes them; any other array key -> ``observation.<key>``, float32.
A single env's observation (no batch dimension) gets one, as LeRobot adds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

OBS = "observation"
OBS_IMAGE = "observation.image"
OBS_IMAGES = "observation.images"
OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.environment_state"
_HANDLED = ("pixels", "environment_state", "agent_pos", "robot_state", "policy", "camera_obs")


class ObservationError(ValueError):
    """An env observation LeRobot's mapping cannot take (channel-first or non-uint8 pixels)."""


def _image(key: str, img: np.ndarray) -> Tensor:
    tensor = torch.from_numpy(img)
    if tensor.ndim == 3:
        tensor = tensor.unsqueeze(0)
    if tensor.ndim != 4:
        raise ObservationError(
            f"{key}: expected (batch, height, width, channel) pixels, got {tuple(tensor.shape)}"
        )
    _, h, w, c = tensor.shape
    if not (c < h and c < w):
        raise ObservationError(f"{key}: expected channel-last pixels, got shape {tuple(tensor.shape)}")
    if tensor.dtype != torch.uint8:
        raise ObservationError(f"{key}: expected uint8 pixels, got {tensor.dtype}")
    tensor = tensor.permute(0, 3, 1, 2).contiguous().type(torch.float32)
    tensor /= 255
    return tensor


def _vector(value: np.ndarray | Tensor) -> Tensor:
    tensor = (torch.from_numpy(value) if isinstance(value, np.ndarray) else value).float()
    return tensor.unsqueeze(0) if tensor.dim() == 1 else tensor


def _nested(d: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: _nested(v) if isinstance(v, dict) else torch.from_numpy(v) if isinstance(v, np.ndarray) else v
        for k, v in d.items()
    }


def preprocess_observation(observations: Mapping[str, Any]) -> dict[str, Any]:
    """The policy-keyed batch of tensors for one vector-env observation (see the module docstring)."""
    out: dict[str, Any] = {}
    if "pixels" in observations:
        pixels = observations["pixels"]
        images = (
            {f"{OBS_IMAGES}.{name}": img for name, img in pixels.items()}
            if isinstance(pixels, dict)
            else {OBS_IMAGE: pixels}
        )
        for key, img in images.items():
            out[key] = _image(key, img)
    if "environment_state" in observations:
        out[OBS_ENV_STATE] = _vector(observations["environment_state"])
    if "agent_pos" in observations:
        out[OBS_STATE] = _vector(observations["agent_pos"])
    if "robot_state" in observations:
        out[f"{OBS}.robot_state"] = _nested(observations["robot_state"])
    for key in ("policy", "camera_obs"):
        if key in observations:
            out[f"{OBS}.{key}"] = observations[key]
    for key, value in observations.items():
        target = f"{OBS}.{key}"
        if key in _HANDLED or target in out:
            continue
        if isinstance(value, np.ndarray | Tensor):
            out[target] = _vector(value)
    return out
