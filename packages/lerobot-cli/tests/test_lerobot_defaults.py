"""Defaults that must be LeRobot's, as the saved processor files show them.

``--dataset.use_imagenet_stats``: LeRobot's default (true) normalises every camera with ImageNet's mean and
std; false keeps the dataset's. Run in this process: a tiny ACT trains one step on the demo dataset with
the default and with the flag false, and the saved processor files and ``train_config.json`` are read back.
pi0/pi05 take ``action_feature_names`` from the dataset's action names, as LeRobot's ``make_policy`` does
(its relative-actions step saves them in the pre-processor file).

LeRobot 0.6.1's dataset factory replaces only ``mean`` and ``std`` of each camera (min, max and count stay
the dataset's) and its ``lerobot-train`` hands the whole ``meta/stats.json`` to both normalizer steps, so
both saved files hold every key; tools/interop/defaults_lerobot_interop.py compares them with LeRobot's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_cli.datasets.imagenet import with_imagenet_stats
from lerobot_cli.datasets.metadata import load_meta
from lerobot_cli.policies.dataset_fit import policy_config_for_dataset
from lerobot_cli.policies.pi0.config import PI0Config
from lerobot_cli.policies.pi05.config import PI05Config
from lerobot_cli.train import main
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
CAMERA = "observation.images.top"
IMAGENET = {
    "mean": torch.tensor([[[0.485]], [[0.456]], [[0.406]]]),
    "std": torch.tensor([[[0.229]], [[0.224]], [[0.225]]]),
}
PRE = "policy_preprocessor_step_3_normalizer_processor.safetensors"
POST = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
ACT = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_encoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
    "--batch_size=2",
    "--steps=1",
    "--log_freq=0",
]


def dataset_stats() -> dict[str, dict[str, torch.Tensor]]:
    raw = json.loads((DEMO / "meta" / "stats.json").read_text())
    return {k: {s: torch.tensor(v, dtype=torch.float32) for s, v in d.items()} for k, d in raw.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """``pretrained_model/`` of a run with the default and of one with the flag false."""
    root = tmp_path_factory.mktemp("imagenet")
    out = {}
    for name, extra in (("default", []), ("dataset", ["--dataset.use_imagenet_stats=false"])):
        assert main([*ACT, *extra, f"--output_dir={root / name}"]) == 0
        out[name] = root / name / "checkpoints" / "last" / "pretrained_model"
    return out


def _camera(directory: Path, file: str) -> dict[str, torch.Tensor]:
    saved = load_file(str(directory / file))
    return {k.rsplit(".", 1)[1]: v for k, v in saved.items() if k.startswith(f"{CAMERA}.")}


def test_default_normalises_cameras_with_imagenet_stats(runs):
    stats = dataset_stats()
    assert not torch.allclose(stats[CAMERA]["mean"], IMAGENET["mean"])  # else the test proves nothing
    directory = runs["default"]
    for file in (PRE, POST):  # LeRobot's unnormalizer holds every statistic too
        camera = _camera(directory, file)
        assert set(camera) == {"mean", "std", "min", "max", "count"}, file
        for name, value in IMAGENET.items():
            assert camera[name].shape == (3, 1, 1) and torch.equal(camera[name], value), (file, name)
        for name in ("min", "max"):  # LeRobot replaces mean and std only
            assert torch.equal(camera[name], stats[CAMERA][name]), (file, name)
    saved = load_file(str(directory / PRE))
    for key in ("observation.state", "action", "timestamp", "index"):  # every other feature as in the dataset
        for name, value in stats[key].items():
            assert torch.equal(saved[f"{key}.{name}"], value.reshape(saved[f"{key}.{name}"].shape)), key
    config = json.loads((directory / "train_config.json").read_text())
    assert config["dataset"]["use_imagenet_stats"] is True


def test_flag_false_keeps_the_dataset_camera_stats(runs):
    stats = dataset_stats()
    directory = runs["dataset"]
    for file in (PRE, POST):
        camera = _camera(directory, file)
        for name in ("mean", "std", "min", "max"):
            assert torch.equal(camera[name], stats[CAMERA][name]), (file, name)
    config = json.loads((directory / "train_config.json").read_text())
    assert config["dataset"]["use_imagenet_stats"] is False


def test_imagenet_stats_skip_depth_maps_and_leave_the_input_alone():
    features = {
        "cam": {"dtype": "video", "shape": [8, 8, 3]},
        "depth": {"dtype": "video", "shape": [8, 8, 1], "info": {"is_depth_map": True}},
        "legacy_depth": {"dtype": "image", "shape": [8, 8, 1], "info": {"video.is_depth_map": True}},
        "state": {"dtype": "float32", "shape": [2]},
        "bare_cam": {"dtype": "image", "shape": [8, 8, 3]},  # a camera without statistics gets ImageNet's
    }
    mean = np.full((3, 1, 1), 0.2)
    stats = {k: {"mean": mean, "std": mean, "min": mean} for k in ("cam", "depth", "legacy_depth", "state")}
    out = with_imagenet_stats(stats, features)
    assert np.array_equal(out["cam"]["mean"], IMAGENET["mean"].numpy())
    assert np.array_equal(out["cam"]["std"], IMAGENET["std"].numpy()) and out["cam"]["min"] is mean
    assert set(out["bare_cam"]) == {"mean", "std"}
    for key in ("depth", "legacy_depth", "state"):
        assert out[key]["mean"] is mean, key
    assert stats["cam"]["mean"] is mean  # the dataset's metadata is not modified


@pytest.mark.parametrize("config_class", [PI0Config, PI05Config])
def test_pi_action_feature_names_come_from_the_dataset(config_class):
    features = load_meta(DEMO).features
    assert features["action"]["names"] == ["x", "y"]
    fitted = policy_config_for_dataset(config_class(action_feature_names=["a", "b"]), features)
    assert fitted.action_feature_names == ["x", "y"]  # LeRobot overwrites what the config said
    features = {k: v for k, v in features.items() if k != "action"} | {
        "action": {k: v for k, v in features["action"].items() if k != "names"}
    }
    assert policy_config_for_dataset(config_class(), features).action_feature_names is None


def test_a_policy_path_fine_tune_normalises_with_the_new_dataset_and_a_resume_keeps_its_own(runs, tmp_path):
    """LeRobot's ``lerobot-train`` overrides a ``--policy.path``'s (un)normaliser statistics with the training
    dataset's (ImageNet's camera mean/std under the default) unless it resumes. Here the new dataset is the
    demo with its state statistics changed; the fine-tune saves those, the resume of that fine-tune on the
    demo itself keeps them."""
    import shutil

    other = Path(shutil.copytree(DEMO, tmp_path / "other"))
    raw = json.loads((other / "meta" / "stats.json").read_text())
    raw["observation.state"]["mean"] = [m + 1.5 for m in raw["observation.state"]["mean"]]
    raw["action"]["std"] = [s * 2 for s in raw["action"]["std"]]
    (other / "meta" / "stats.json").write_text(json.dumps(raw))
    base = runs["dataset"]  # trained with the dataset's own camera statistics
    args = [a for a in ACT if not a.startswith(("--dataset.root", "--policy."))]
    tuned = tmp_path / "tuned"
    assert main([*args, f"--dataset.root={other}", f"--policy.path={base}", f"--output_dir={tuned}"]) == 0
    saved = tuned / "checkpoints" / "last" / "pretrained_model"
    for file in (PRE, POST):
        values = load_file(str(saved / file))
        assert torch.equal(values["action.std"], torch.tensor(raw["action"]["std"], dtype=torch.float32)), (
            file
        )
        camera = _camera(saved, file)
        for name, value in IMAGENET.items():  # the default flag applies to the new dataset's stats
            assert torch.equal(camera[name], value), (file, name)
    state_mean = load_file(str(saved / PRE))["observation.state.mean"]
    assert torch.equal(state_mean, torch.tensor(raw["observation.state"]["mean"], dtype=torch.float32))
    resumed = [
        *args,
        f"--dataset.root={DEMO}",
        "--resume=true",
        f"--config_path={saved / 'train_config.json'}",
        "--steps=2",
    ]
    assert main(resumed) == 0
    again = load_file(str(tuned / "checkpoints" / "last" / "pretrained_model" / PRE))
    assert torch.equal(again["observation.state.mean"], state_mean)  # a resume keeps its checkpoint's
