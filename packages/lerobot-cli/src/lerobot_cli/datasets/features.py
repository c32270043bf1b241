"""Policy delta indices -> dataset delta timestamps, and the dataset -> policy features conversion.

Mirrors LeRobot's ``resolve_delta_timestamps``. ``dataset_to_policy_features`` and
``split_policy_features`` live in the neutral :mod:`lerobot_cli.features` (policy code needs them and
must not import datasets); they are re-exported here because ``lerobot_cli.datasets`` offers them.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lerobot_cli.features import dataset_to_policy_features, split_policy_features

__all__ = ["dataset_to_policy_features", "resolve_delta_timestamps", "split_policy_features"]


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
