"""FastWAM's processor pipelines (policies/fastwam/processors.py, toggle.py) as LeRobot 0.6.1 lays them out.

The config here is a stand-in with FastWAM's normalisation mapping and the one field the step lists read
(``toggle_action_dimensions``), so the lists are tested apart from the config class. The expected JSON is
written from LeRobot's ``processor_fastwam.py``; tools/interop/fastwam_lerobot_interop.py compares the saved
files byte for byte with the ones LeRobot itself writes.
"""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import torch
from attrs import define, field
from lerobot_cli.features import FeatureType, NormalizationMode, PolicyFeature
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.fastwam.processors import fastwam_processor_steps
from lerobot_cli.policies.fastwam.toggle import ActionToggleStep
from lerobot_cli.policies.spec import PolicySpec
from lerobot_cli.processors import load_processors, make_pre_post_processors, save_processors

STATE, ACTION, CAMERA = "observation.state", "action", "observation.images.top"


@define(frozen=True, kw_only=True)
class FastWAMLike(PolicyConfig):
    """FastWAM's normalisation mapping and toggle field, without the networks."""

    type: ClassVar[str] = "fastwam_processors_test"
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="tests:Unused", processors="lerobot_cli.policies.fastwam.processors:fastwam_processor_steps"
    )

    normalization_mapping: dict[str, NormalizationMode] = field(
        factory=lambda: {
            "VISUAL": NormalizationMode.IDENTITY,
            "STATE": NormalizationMode.MEAN_STD,
            "ACTION": NormalizationMode.MEAN_STD,
        }
    )
    toggle_action_dimensions: list[int] = field(factory=list)


def config(toggle: list[int]) -> FastWAMLike:
    return FastWAMLike(
        input_features={
            CAMERA: PolicyFeature(FeatureType.VISUAL, (3, 16, 32)),
            STATE: PolicyFeature(FeatureType.STATE, (3,)),
        },
        output_features={ACTION: PolicyFeature(FeatureType.ACTION, (4,))},
        device="cpu",
        toggle_action_dimensions=toggle,
    )


STATS = {
    STATE: {"mean": [0.5, -0.5, 0.0], "std": [2.0, 1.0, 0.5]},
    ACTION: {"mean": [0.1, 0.2, 0.3, 0.4], "std": [1.0, 2.0, 0.5, 0.25]},
    CAMERA: {"mean": [[[0.5]], [[0.5]], [[0.5]]], "std": [[[0.01]], [[0.01]], [[0.01]]]},
}


def expected_files(toggle: list[int]) -> tuple[dict, dict]:
    """policy_preprocessor.json / policy_postprocessor.json as LeRobot's make_fastwam_pre_post_processors
    saves them."""
    features = {
        CAMERA: {"type": "VISUAL", "shape": [3, 16, 32]},
        STATE: {"type": "STATE", "shape": [3]},
        ACTION: {"type": "ACTION", "shape": [4]},
    }
    norm_map = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    pre = {
        "name": "policy_preprocessor",
        "steps": [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}},
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
            {
                "registry_name": "normalizer_processor",
                "config": {"eps": 1e-8, "features": features, "norm_map": norm_map},
                "state_file": "policy_preprocessor_step_3_normalizer_processor.safetensors",
            },
        ],
    }
    post_steps = [
        {
            "registry_name": "unnormalizer_processor",
            "config": {"eps": 1e-8, "features": {ACTION: features[ACTION]}, "norm_map": norm_map},
            "state_file": "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
        }
    ]
    if toggle:
        post_steps.append(
            {"registry_name": "fastwam_action_toggle_processor", "config": {"toggle_dimensions": toggle}}
        )
    post_steps.append({"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}})
    return pre, {"name": "policy_postprocessor", "steps": post_steps}


@pytest.mark.parametrize("toggle", [[], [3], [-1, 0]])
def test_the_saved_pipelines_are_lerobots_step_for_step(tmp_path, toggle):
    pre, post = make_pre_post_processors(config(toggle), STATS)
    save_processors(pre, post, tmp_path)
    want_pre, want_post = expected_files(toggle)
    assert json.loads((tmp_path / "policy_preprocessor.json").read_text()) == want_pre
    assert json.loads((tmp_path / "policy_postprocessor.json").read_text()) == want_post


def test_state_and_action_are_standardised_and_images_pass_unchanged():
    pre, _ = make_pre_post_processors(config([]), STATS)
    g = torch.Generator().manual_seed(0)
    batch = {
        STATE: torch.randn(2, 3, generator=g),
        ACTION: torch.randn(2, 5, 4, generator=g),
        CAMERA: torch.rand(2, 9, 3, 16, 32, generator=g),
        "task": ["a", "b"],
    }
    out = pre({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()})
    for key in (STATE, ACTION):
        mean, std = torch.tensor(STATS[key]["mean"]), torch.tensor(STATS[key]["std"])
        torch.testing.assert_close(out[key], (batch[key] - mean) / (std + 1e-8))
    assert torch.equal(out[CAMERA], batch[CAMERA])  # IDENTITY, although the camera has statistics
    assert out["task"] == ["a", "b"]


def test_the_post_processor_unnormalises_then_toggles():
    _, post = make_pre_post_processors(config([3]), STATS)
    normalised = torch.zeros(2, 5, 4)  # unnormalised: the means, so the gripper channel reads 0.4 → +1
    action = post(normalised)
    torch.testing.assert_close(action[..., :3], torch.tensor([0.1, 0.2, 0.3]).expand(2, 5, 3))
    assert torch.equal(action[..., 3], torch.ones(2, 5))


def test_toggle_maps_zero_to_one_onto_minus_the_sign_of_two_a_minus_one():
    action = torch.tensor([[0.0, 0.25, 0.5, 0.75, 1.0], [5.0, 5.0, 5.0, 5.0, 5.0]]).T.contiguous()  # [5, 2]
    out = ActionToggleStep([0])({"action": action})["action"]
    assert out[:, 0].tolist() == [1.0, 1.0, 0.0, -1.0, -1.0]
    assert out[:, 1].tolist() == [5.0] * 5  # other dimensions untouched
    assert action[:, 0].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]  # the input is not changed in place
    assert torch.equal(ActionToggleStep([-2])({"action": action})["action"], out)  # negative: from the end


def test_toggle_refuses_a_dimension_outside_the_action_and_a_batch_without_one():
    with pytest.raises(ValueError, match="dimension 2 is out of bounds for action dim 2"):
        ActionToggleStep([2])({"action": torch.zeros(3, 2)})
    with pytest.raises(ValueError, match="dimension -3 is out of bounds"):
        ActionToggleStep([-3])({"action": torch.zeros(3, 2)})
    with pytest.raises(ValueError, match="needs an action"):
        ActionToggleStep([0])({"observation.state": torch.zeros(3, 2)})
    batch = {"action": torch.zeros(3, 2)}
    assert ActionToggleStep([])(batch) is batch


def test_saved_pipelines_load_back_with_the_same_outputs(tmp_path):
    pre, post = make_pre_post_processors(config([1]), STATS)
    save_processors(pre, post, tmp_path)
    pre2, post2 = load_processors(tmp_path)
    assert [s.registry_name for s in post2.steps] == [
        "unnormalizer_processor",
        "fastwam_action_toggle_processor",
        "device_processor",
    ]
    g = torch.Generator().manual_seed(1)
    batch = {STATE: torch.randn(2, 3, generator=g), ACTION: torch.randn(2, 5, 4, generator=g)}
    assert all(torch.equal(pre(dict(batch))[k], pre2(dict(batch))[k]) for k in batch)
    action = torch.randn(2, 5, 4, generator=g)
    assert torch.equal(post(action), post2(action))


def test_the_step_lists_need_only_the_toggle_field():
    class Bare:
        toggle_action_dimensions = (2,)

    pre_steps, post_steps = fastwam_processor_steps(Bare(), _defaults())
    assert [s.registry_name for s in pre_steps] == [
        "rename_observations_processor",
        "to_batch_processor",
        "device_processor",
        "normalizer_processor",
    ]
    assert post_steps[1].get_config() == {"toggle_dimensions": [2]}


def _defaults():
    from lerobot_cli.processors.factory import DefaultSteps
    from lerobot_cli.processors.normalize import NormalizerStep, UnnormalizerStep
    from lerobot_cli.processors.steps import AddBatchDimensionStep, DeviceStep, RenameObservationsStep

    return DefaultSteps(
        rename_observations=RenameObservationsStep(),
        add_batch_dim=AddBatchDimensionStep(),
        to_device=DeviceStep("cpu"),
        normalize=NormalizerStep(features={}, norm_map={}, stats={}),
        unnormalize=UnnormalizerStep(features={}, norm_map={}, stats={}),
        to_cpu=DeviceStep("cpu"),
    )
