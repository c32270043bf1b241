"""Dataset features -> policy features, and policy delta indices -> dataset delta timestamps.

Mirrors LeRobot's ``dataset_to_policy_features`` / ``resolve_delta_timestamps`` so that a policy config
built here has the same input/output features (and ``config.json``) as one built by LeRobot. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.metadata import visual_chw
from lerobot_cli.policies.features import FeatureType, PolicyFeature


def dataset_to_policy_features(features: Mapping[str, dict]) -> dict[str, PolicyFeature]:
    """key -> PolicyFeature for every feature a policy can consume.

    Cameras are VISUAL with a (C, H, W) shape, ``observation.environment_state`` is ENV, any other
    ``observation*`` key is STATE and ``action*`` is ACTION; bookkeeping columns (timestamp, index, ...) and
    anything else (``next.reward``, ...) are left out, as in LeRobot.
    """
    out: dict[str, PolicyFeature] = {}
    for key, ft in features.items():
        if ft["dtype"] in L.VISUAL_DTYPES:
            out[key] = PolicyFeature(type=FeatureType.VISUAL, shape=visual_chw(key, ft))
        elif key == "observation.environment_state":
            out[key] = PolicyFeature(type=FeatureType.ENV, shape=ft["shape"])
        elif key.startswith("observation"):
            out[key] = PolicyFeature(type=FeatureType.STATE, shape=ft["shape"])
        elif key.startswith("action"):
            out[key] = PolicyFeature(type=FeatureType.ACTION, shape=ft["shape"])
    return out


def split_policy_features(
    features: Mapping[str, PolicyFeature],
) -> tuple[dict[str, PolicyFeature], dict[str, PolicyFeature]]:
    """(input_features, output_features): actions are outputs, everything else inputs (LeRobot's rule)."""
    outputs = {k: f for k, f in features.items() if f.type is FeatureType.ACTION}
    inputs = {k: f for k, f in features.items() if k not in outputs}
    return inputs, outputs


def resolve_delta_timestamps(
    features: Mapping[str, dict],
    fps: float,
    *,
    observation_delta_indices: Sequence[int] | None = None,
    action_delta_indices: Sequence[int] | None = None,
    reward_delta_indices: Sequence[int] | None = None,
) -> dict[str, list[float]] | None:
    """delta_timestamps for LeRobotDataset from a policy's frame offsets (ACT: action 0..chunk_size-1)."""
    out: dict[str, list[float]] = {}
    for key in features:
        if key == "next.reward" and reward_delta_indices is not None:
            out[key] = [i / fps for i in reward_delta_indices]
        if key == "action" and action_delta_indices is not None:
            out[key] = [i / fps for i in action_delta_indices]
        if key.startswith("observation.") and observation_delta_indices is not None:
            out[key] = [i / fps for i in observation_delta_indices]
    return out or None
