"""A policy's feature checks against its dataset are one usage error, before torch when the dataset is on
disk (cli.checks) and again when the run builds the policy (a Hub dataset): pi0/pi05 without a camera
names --policy.empty_cameras, a diffusion crop larger than the images names the largest valid one.
End-to-end rows (exit 2, one line, also under torchrun x2): tests/data/bad_inputs.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.cli.checks import check_runnable
from lerobot_cli.errors import ConfigError

DEMO = Path(__file__).resolve().parents[3] / "data" / "lerobot" / "demo_reach"
PI0 = [
    "--policy.type=pi0",
    "--policy.paligemma_variant=gemma_tiny",
    "--policy.action_expert_variant=gemma_tiny",
    "--policy.vision_variant=tiny",
    "--policy.image_resolution=[56,56]",
    "--policy.tokenizer_name=x/y",
]


@pytest.fixture(scope="module")
def no_camera(tmp_path_factory) -> Path:
    """The demo's metadata with its camera removed from meta/info.json (metadata is all the check reads)."""
    root = tmp_path_factory.mktemp("no_camera")
    shutil.copytree(DEMO / "meta", root / "meta")
    info = json.loads((root / "meta" / "info.json").read_text())
    del info["features"]["observation.images.top"]
    (root / "meta" / "info.json").write_text(json.dumps(info))
    return root


def config(*flags: str):
    return build_train_config(dict(f.removeprefix("--").split("=", 1) for f in flags)).config.finalized()


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_pi_without_a_camera_names_empty_cameras_before_torch(no_camera, kind):
    flags = [f"--dataset.root={no_camera}", "--dataset.repo_id=a/b", *PI0]
    flags[2] = f"--policy.type={kind}"
    with pytest.raises(ConfigError) as exc:
        check_runnable(config(*flags), None)
    assert str(exc.value).startswith(
        f"{kind} needs a camera, but the dataset has none (no observation.images.*"
    )
    assert "pass --policy.empty_cameras=1" in str(exc.value) and "\n" not in str(exc.value)
    check_runnable(config(*flags, "--policy.empty_cameras=1"), None)  # the way out it names works


def test_diffusion_crop_larger_than_the_images_before_torch():
    flags = [
        f"--dataset.root={DEMO}",
        "--dataset.repo_id=a/b",
        "--policy.type=diffusion",
        "--policy.pretrained_backbone_weights=null",
    ]
    with pytest.raises(
        ConfigError,
        match=r"^--policy.crop_shape \[100, 90\] does not fit inside observation.images.top "
        r"\(64x64\): give at most \[64, 64\], or null for no crop$",
    ):
        check_runnable(config(*flags, "--policy.crop_shape=[100,90]"), None)
    check_runnable(config(*flags, "--policy.crop_shape=[60,60]"), None)


def test_a_dataset_not_on_disk_is_left_to_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path))  # nothing cached: the check must not download
    check_runnable(config("--dataset.repo_id=someone/not_here", *PI0), None)


def test_the_run_checks_again_on_the_dataset_it_built(no_camera):
    """A Hub dataset is only on disk once the run downloaded it: the policy build refuses the same way
    (a ConfigError, one line under the runner) instead of a ValueError traceback from the model's init."""
    from lerobot_cli.datasets import load_meta
    from lerobot_cli.workload import build_policy_for

    cfg = config(f"--dataset.root={no_camera}", "--dataset.repo_id=a/b", *PI0)
    with pytest.raises(ConfigError, match=r"pi0 needs a camera, but the dataset has none"):
        build_policy_for(cfg, load_meta(no_camera).features)
