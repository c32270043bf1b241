"""The feature vocabulary lives in the neutral ``lerobot_cli.features``: policies and datasets both read it,
the dataset reader still says a bad camera shape as a ``DatasetError`` (its file is what to fix), and
``lerobot_cli.datasets`` still offers the conversion under its old names."""

from __future__ import annotations

import re

import pytest
from lerobot_cli import datasets, features
from lerobot_cli.datasets.metadata import visual_chw
from lerobot_cli.errors import ConfigError

CAMERA = "observation.images.top"


def test_the_dataset_api_offers_the_neutral_conversion():
    assert datasets.dataset_to_policy_features is features.dataset_to_policy_features
    assert datasets.split_policy_features is features.split_policy_features
    from lerobot_cli import policies

    assert policies.PolicyFeature is features.PolicyFeature and policies.FeatureType is features.FeatureType


def test_a_camera_in_hwc_becomes_chw_and_actions_are_outputs():
    info = {
        CAMERA: {"dtype": "video", "shape": [48, 64, 3], "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": [2]},
        "action": {"dtype": "float32", "shape": [2]},
        "timestamp": {"dtype": "float32", "shape": [1]},
    }
    inputs, outputs = features.split_policy_features(features.dataset_to_policy_features(info))
    assert inputs == {
        CAMERA: features.PolicyFeature(features.FeatureType.VISUAL, (3, 48, 64)),
        "observation.state": features.PolicyFeature(features.FeatureType.STATE, (2,)),
    }
    assert outputs == {"action": features.PolicyFeature(features.FeatureType.ACTION, (2,))}


def test_a_camera_shape_that_is_not_3d_is_a_dataset_error_in_the_reader_and_a_config_error_outside():
    bad = {"dtype": "video", "shape": [64, 64]}
    message = f"meta/info.json: feature {CAMERA!r} has shape [64, 64]; images need 3 dims"
    with pytest.raises(datasets.DatasetError, match=f"^{re.escape(message)}$"):
        visual_chw(CAMERA, bad)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        features.dataset_to_policy_features({CAMERA: bad})
