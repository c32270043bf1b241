"""Normalization pipelines: formulas per mode, pre→post inversion, LeRobot's file layout, round trips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_cli.features import NormalizationMode, PolicyFeature
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.processors import (
    STEP_REGISTRY,
    DeviceStep,
    NormalizerStep,
    ProcessorPipeline,
    load_processors,
    make_pre_post_processors,
    save_processors,
)

LEROBOT_DIR = Path(__file__).parent / "data" / "lerobot_act_env"
FEATURES_IN = {
    "observation.state": PolicyFeature("STATE", (3,)),
    "observation.images.top": PolicyFeature("VISUAL", (3, 4, 4)),
}
FEATURES_OUT = {"action": PolicyFeature("ACTION", (2,))}


def _stats():
    # Mixed input types on purpose: dataset stats arrive as lists (stats.json), arrays or tensors.
    return {
        "observation.state": {
            "mean": [1.0, 2.0, 3.0],
            "std": np.array([2.0, 4.0, 0.5]),
            "min": [0.0, 0.0, 0.0],
            "max": [2.0, 4.0, 0.0],
            "count": [10],
        },
        "observation.images.top": {
            "mean": torch.tensor([0.5, 0.4, 0.3]),
            "std": [[[0.2]], [[0.2]], [[0.1]]],
            "min": [0.0] * 3,
            "max": [1.0] * 3,
        },
        "action": {"mean": [0.5, -1.0], "std": [2.0, 0.25], "min": [-1.0, -2.0], "max": [3.0, 2.0]},
        "timestamp": {"mean": [0.0], "std": [1.0]},  # not a policy feature: ignored
    }


def _config(mapping=None) -> ACTConfig:
    kwargs = {} if mapping is None else {"normalization_mapping": mapping}
    return ACTConfig(input_features=FEATURES_IN, output_features=FEATURES_OUT, **kwargs)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.state": torch.randn(2, 3, generator=g),
        "observation.images.top": torch.rand(2, 3, 4, 4, generator=g),
        "action": torch.randn(2, 5, 2, generator=g),
        "action_is_pad": torch.zeros(2, 5, dtype=torch.bool),
        "task": ["reach", "reach"],
    }


def test_mean_std_formula_and_untouched_keys():
    pre, _ = make_pre_post_processors(_config(), _stats())
    batch = _batch()
    out = pre(batch)
    torch.testing.assert_close(
        out["observation.state"],
        (batch["observation.state"] - torch.tensor([1.0, 2.0, 3.0])) / (torch.tensor([2.0, 4.0, 0.5]) + 1e-8),
    )
    img_mean, img_std = (
        torch.tensor([0.5, 0.4, 0.3]).view(3, 1, 1),
        torch.tensor([0.2, 0.2, 0.1]).view(3, 1, 1),
    )
    torch.testing.assert_close(
        out["observation.images.top"], (batch["observation.images.top"] - img_mean) / (img_std + 1e-8)
    )
    torch.testing.assert_close(
        out["action"], (batch["action"] - torch.tensor([0.5, -1.0])) / torch.tensor([2.0, 0.25])
    )
    assert out["task"] == batch["task"] and out["action_is_pad"] is batch["action_is_pad"]
    assert batch["observation.state"] is not out["observation.state"]  # input batch not modified


def test_min_max_and_identity_modes():
    mapping = {
        "STATE": NormalizationMode.MIN_MAX,
        "VISUAL": NormalizationMode.IDENTITY,
        "ACTION": NormalizationMode.MIN_MAX,
    }
    pre, post = make_pre_post_processors(_config(mapping), _stats())
    batch = _batch()
    out = pre(batch)
    state = batch["observation.state"]
    # third state dim has max == min: the range falls back to eps instead of dividing by zero
    expected = torch.stack([2 * state[:, 0] / 2 - 1, 2 * state[:, 1] / 4 - 1, 2 * state[:, 2] / 1e-8 - 1], -1)
    torch.testing.assert_close(out["observation.state"], expected)
    assert torch.equal(out["observation.images.top"], batch["observation.images.top"])
    torch.testing.assert_close(post(out["action"]), batch["action"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["MEAN_STD", "MIN_MAX"])
def test_postprocessor_inverts_preprocessor_on_actions(mode):
    mapping = {"STATE": mode, "VISUAL": mode, "ACTION": mode}
    pre, post = make_pre_post_processors(_config(mapping), _stats())
    action = _batch()["action"]
    normalized = pre({"action": action})["action"]
    assert not torch.allclose(normalized, action)
    torch.testing.assert_close(post(normalized), action, rtol=1e-5, atol=1e-5)


def test_missing_stats_are_named():
    stats = _stats()
    del stats["action"]["std"]
    with pytest.raises(ValueError, match=r"action\.std"):
        make_pre_post_processors(_config(), stats)
    # IDENTITY needs nothing
    make_pre_post_processors(_config({"STATE": "IDENTITY", "VISUAL": "IDENTITY", "ACTION": "IDENTITY"}), {})


def test_unbatched_observation_gets_a_batch_dim_and_dtype_cast():
    pre, _ = make_pre_post_processors(_config(), _stats())
    obs = {"observation.state": torch.zeros(3), "observation.images.top": torch.zeros(3, 4, 4), "task": "go"}
    out = pre(obs)
    assert out["observation.state"].shape == (1, 3) and out["observation.images.top"].shape == (1, 3, 4, 4)
    assert out["task"] == ["go"]
    half = DeviceStep("cpu", float_dtype="bfloat16")(
        {"a": torch.zeros(2), "b": torch.zeros(2, dtype=torch.long)}
    )
    assert half["a"].dtype == torch.bfloat16 and half["b"].dtype == torch.long


def test_device_step_keeps_the_dataset_index_on_the_host():
    """Policies read ``index`` on the host (per-sample noise seeds):
    a device copy would be read back each step."""
    moved = DeviceStep("meta")({"index": torch.arange(3), "action": torch.zeros(3, 2)})
    assert moved["action"].device.type == "meta" and moved["index"].device.type == "cpu"


def test_saved_files_use_lerobot_names_and_step_layout(tmp_path):
    pre, post = make_pre_post_processors(_config(), _stats(), device="cpu")
    written = save_processors(pre, post, tmp_path)
    assert sorted(p.name for p in written) == sorted(
        [
            "policy_preprocessor.json",
            "policy_preprocessor_step_3_normalizer_processor.safetensors",
            "policy_postprocessor.json",
            "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
        ]
    )
    pre_json = json.loads((tmp_path / "policy_preprocessor.json").read_text())
    assert pre_json["name"] == "policy_preprocessor"
    assert [s["registry_name"] for s in pre_json["steps"]] == [
        "rename_observations_processor",
        "to_batch_processor",
        "device_processor",
        "normalizer_processor",
    ]
    assert pre_json["steps"][2]["config"] == {"device": "cpu", "float_dtype": None}
    norm = pre_json["steps"][3]
    assert norm["config"]["eps"] == 1e-8 and norm["config"]["norm_map"]["ACTION"] == "MEAN_STD"
    assert norm["config"]["features"]["observation.images.top"] == {"type": "VISUAL", "shape": [3, 4, 4]}
    post_json = json.loads((tmp_path / "policy_postprocessor.json").read_text())
    assert [s["registry_name"] for s in post_json["steps"]] == ["unnormalizer_processor", "device_processor"]


def test_save_load_round_trip_gives_identical_outputs(tmp_path):
    pre, post = make_pre_post_processors(_config(), _stats())
    save_processors(pre, post, tmp_path)
    pre2, post2 = load_processors(tmp_path)
    batch = _batch(3)
    a, b = pre(batch), pre2(batch)
    for key in ("observation.state", "observation.images.top", "action"):
        assert torch.equal(a[key], b[key])
    assert torch.equal(post(a["action"]), post2(b["action"]))
    assert set(pre2.step("normalizer_processor").state_dict()) == set(
        pre.step("normalizer_processor").state_dict()
    )


def test_lerobot_written_pipelines_load():
    pre, _ = load_processors(LEROBOT_DIR)
    assert [s.registry_name for s in pre.steps] == [
        "rename_observations_processor",
        "to_batch_processor",
        "device_processor",
        "normalizer_processor",
    ]
    normalizer = pre.step("normalizer_processor")
    assert isinstance(normalizer, NormalizerStep)
    assert {"observation.state", "observation.environment_state", "action"} <= set(normalizer.stats)
    state = torch.zeros(1, 4)
    mean, std = normalizer.stats["observation.state"]["mean"], normalizer.stats["observation.state"]["std"]
    torch.testing.assert_close(
        pre({"observation.state": state})["observation.state"], (state - mean) / (std + 1e-8)
    )


def test_unknown_step_and_missing_state_file_fail_clearly(tmp_path):
    (tmp_path / "p.json").write_text(
        json.dumps({"name": "p", "steps": [{"registry_name": "tokenizer_processor"}]})
    )
    with pytest.raises(ValueError, match="tokenizer_processor"):
        ProcessorPipeline.from_pretrained(tmp_path, "p.json")
    pre, post = make_pre_post_processors(_config(), _stats())
    save_processors(pre, post, tmp_path)
    (tmp_path / "policy_preprocessor_step_3_normalizer_processor.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="normalizer_processor"):
        load_processors(tmp_path)
    assert {
        "normalizer_processor",
        "unnormalizer_processor",
        "device_processor",
        "to_batch_processor",
        "rename_observations_processor",
    } <= set(STEP_REGISTRY)


def test_every_pipeline_file_problem_is_a_checkpoint_error_naming_the_file(tmp_path):
    """What lerobot-train prints as one line (a CheckpointError), never a traceback; nothing is imported."""
    from lerobot_ckpt import CheckpointError, CorruptCheckpointError
    from lerobot_cli.processors.pipeline import ProcessorFileError

    file = tmp_path / "p.json"
    cases = [
        (
            {"steps": [{"class": "os.system", "config": {"command": "touch RAN"}}]},
            r"p.json: step 0 names the Python class 'os.system', which is never imported",
        ),
        (
            {"steps": [{"registry_name": "device_processor", "config": {"devise": "cpu"}}]},
            r"p.json: step 0 \(device_processor\): .*devise",
        ),
        (
            {"steps": {"registry_name": "device_processor"}},
            r"p.json must hold a JSON object with a 'steps' list",
        ),
        ("{not json", r"p.json is not a readable JSON file"),
    ]
    for content, message in cases:
        file.write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(ProcessorFileError, match=message):
            ProcessorPipeline.from_pretrained(tmp_path, "p.json")
    assert not (tmp_path / "RAN").exists() and issubclass(ProcessorFileError, CheckpointError)
    pre, post = make_pre_post_processors(_config(), _stats())
    save_processors(pre, post, tmp_path)
    state = tmp_path / "policy_preprocessor_step_3_normalizer_processor.safetensors"
    state.write_bytes(state.read_bytes()[:40])  # truncated: the weights' own sentence (read_tensors)
    with pytest.raises(
        CorruptCheckpointError, match=r"normalizer_processor.safetensors: not a readable safetensors"
    ):
        load_processors(tmp_path)


def test_rename_and_device_override(tmp_path):
    pre, post = make_pre_post_processors(
        _config(), _stats(), device="cuda:1", rename_map={"observation.images.cam": "observation.images.top"}
    )
    save_processors(pre, post, tmp_path)  # saved on a GPU machine ...
    pre2, _ = load_processors(tmp_path, device="cpu")  # ... used on a CPU one
    assert pre2.step("device_processor").get_config()["device"] == "cpu"
    out = pre2({"observation.images.cam": torch.zeros(1, 3, 4, 4)})
    assert "observation.images.top" in out and "observation.images.cam" not in out
    assert out["observation.images.top"].device.type == "cpu"


def test_a_uint8_camera_is_refused_not_normalised_255_times_too_large():
    """Cameras as the DataLoader hands them over (uint8, 0..255) against [0, 1] statistics would be
    normalised into nonsense without a word: the step refuses them, naming the camera and the fix."""
    pre, _ = make_pre_post_processors(_config(), _stats())
    batch = _batch()
    batch["observation.images.top"] = (batch["observation.images.top"] * 255).to(torch.uint8)
    with pytest.raises(ValueError, match=r"camera 'observation.images.top' is uint8 .*cameras_to_float"):
        pre(batch)
    # integer states are still cast (a dataset may store them as int64)
    batch = _batch()
    batch["observation.state"] = batch["observation.state"].round().to(torch.int64)
    assert pre(batch)["observation.state"].dtype == torch.float32
