"""LeRobot's feature vocabulary, shared by policies and datasets (torch-free, imports neither).

A policy's ``config.json`` names its inputs and outputs with these types, and a dataset's
``meta/info.json`` features become them through :func:`dataset_to_policy_features`. Both ``policies/``
and ``datasets/`` import this module and never each other (``tests/test_import_dag.py``): the policy
code that fits a config to a dataset (``policies.dataset_fit``, FastWAM's ``fit_dataset``) needs the
conversion, but not the dataset reader, and the reader needs no policy.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from attrs import define, field

from lerobot_cli.errors import ConfigError

VISUAL_DTYPES: tuple[str, ...] = ("image", "video")  # info.json's camera dtypes (LeRobot's)


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


def visual_chw(key: str, feature: Mapping) -> tuple[int, int, int]:
    """(C, H, W) of an image/video feature.

    LeRobot stores camera shapes as (H, W, C) with names ending in "channels" (or "channel", from datasets
    ported to v2.0); any other naming is taken as already channel-first, exactly as LeRobot's
    ``dataset_to_policy_features`` does. The dataset reader checks every camera with it when it loads
    ``meta/info.json`` (and says so as a ``DatasetError``).
    """
    shape = tuple(feature["shape"])
    if len(shape) != 3:
        raise ConfigError(f"meta/info.json: feature {key!r} has shape {list(shape)}; images need 3 dims")
    names = feature.get("names")
    if isinstance(names, (list, tuple)) and len(names) == 3 and names[2] in ("channel", "channels"):
        return shape[2], shape[0], shape[1]
    return shape  # type: ignore[return-value]


def dataset_to_policy_features(features: Mapping[str, dict]) -> dict[str, PolicyFeature]:
    """key -> PolicyFeature for every feature a policy can consume (LeRobot's ``dataset_to_policy_features``,
    so a policy config built here has the same input/output features and ``config.json`` as LeRobot's).

    Cameras are VISUAL with a (C, H, W) shape, ``observation.environment_state`` is ENV, any other
    ``observation*`` key is STATE and ``action*`` is ACTION; bookkeeping columns (timestamp, index, ...) and
    anything else (``next.reward``, ...) are left out, as in LeRobot.
    """
    out: dict[str, PolicyFeature] = {}
    for key, ft in features.items():
        if ft["dtype"] in VISUAL_DTYPES:
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
