"""Feature and normalization vocabulary shared with LeRobot's ``config.json`` (torch-free)."""

from __future__ import annotations

import enum

from attrs import define, field


class FeatureType(str, enum.Enum):
    STATE = "STATE"
    VISUAL = "VISUAL"
    ENV = "ENV"
    ACTION = "ACTION"
    REWARD = "REWARD"
    LANGUAGE = "LANGUAGE"


class NormalizationMode(str, enum.Enum):
    MIN_MAX = "MIN_MAX"
    MEAN_STD = "MEAN_STD"
    IDENTITY = "IDENTITY"
    QUANTILES = "QUANTILES"  # q01/q99 to [-1, 1] (pi05's default for state and action)
    QUANTILE10 = "QUANTILE10"  # q10/q90 to [-1, 1]


def normalization_mapping(
    visual: NormalizationMode, state: NormalizationMode, action: NormalizationMode
) -> dict[str, NormalizationMode]:
    """A ``normalization_mapping`` value (LeRobot's keys): a policy config's default factory builds one."""
    return {"VISUAL": visual, "STATE": state, "ACTION": action}


def _shape(value) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@define(frozen=True)
class PolicyFeature:
    """One input or output of a policy: its role and its per-frame shape."""

    type: FeatureType = field(converter=FeatureType)
    shape: tuple[int, ...] = field(converter=_shape)
