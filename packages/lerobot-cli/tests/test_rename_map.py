"""``--rename_map`` (LeRobot 0.6.1's flag): a tiny ACT trained on a dataset whose camera is ``top`` fine-tunes
on one whose camera is ``front`` with ``{"observation.images.front": "observation.images.top"}``; the saved
pre-processor holds the map and renames by itself, the statistics follow the rename, and every wrong use is
one line. In-process (``lerobot_cli.train.main``), two small datasets written here."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_cli.datasets.writer import EpisodeData, write_dataset
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.pretrained import load_pretrained
from lerobot_cli.processors import load_processors
from lerobot_cli.rename import check_rename_map, suggested_map
from lerobot_cli.train import main
from safetensors.torch import load_file

TOP, FRONT = "observation.images.top", "observation.images.front"
MAP = json.dumps({FRONT: TOP})
SHAPE = [24, 32, 3]
ACT = [
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
]
RUN = ["--num_workers=0", "--batch_size=4", "--steps=2", "--log_freq=0"]


def write(root: Path, camera: str, seed: int, scale: float) -> Path:
    """Two short episodes: state, action and one camera named ``camera`` (pixel statistics by ``scale``)."""
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        camera: {"dtype": "video", "shape": SHAPE, "names": ["height", "width", "channels"]},
    }

    def episode(ep: int, n: int) -> EpisodeData:
        rng = np.random.default_rng(seed + ep)
        t = np.arange(n, dtype=np.float32)
        return EpisodeData(
            task="reach",
            frames={
                "observation.state": (seed + scale * rng.normal(size=(n, 3))).astype(np.float32),
                "action": np.stack([t / n, -scale * t / n], axis=1).astype(np.float32),
                camera: rng.integers(0, int(120 * scale), (n, *SHAPE), dtype=np.uint8),
            },
        )

    return write_dataset(root, 10, features, (episode(e, n) for e, n in enumerate([12, 10])))


def data(root: Path, name: str) -> list[str]:
    return [f"--dataset.repo_id=org/{name}", f"--dataset.root={root}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("rename")
    top, front = write(tmp / "top", TOP, 10, 1.0), write(tmp / "front", FRONT, 20, 2.0)
    assert main([*data(top, "top"), *ACT, *RUN, f"--output_dir={tmp / 'base'}"]) == 0
    base = tmp / "base" / "checkpoints" / "last" / "pretrained_model"
    tuned = [*data(front, "front"), f"--policy.path={base}", *RUN, "--dataset.use_imagenet_stats=false"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*tuned, f"--rename_map={MAP}", f"--output_dir={tmp / 'tuned'}"]) == 0
    assert f"Rename: {FRONT} → {TOP} (--rename_map" in out.getvalue()  # the banner says it
    return {"top": top, "front": front, "base": base, "tuned": tmp / "tuned" / "checkpoints" / "last"}


def refused(argv: list[str], capsys) -> str:
    """The one error line of a run that must stop (exit 2) before training."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not line.startswith("lerobot-train: warning:")]
    assert code == 2 and "Traceback" not in err and len(errors) == 1, err
    return errors[0]


def test_the_saved_preprocessor_renames_with_the_map(runs):
    pretrained = runs["tuned"] / "pretrained_model"
    steps = json.loads((pretrained / "policy_preprocessor.json").read_text())["steps"]
    assert steps[0] == {
        "registry_name": "rename_observations_processor",
        "config": {"rename_map": {FRONT: TOP}},
    }
    assert json.loads((pretrained / "train_config.json").read_text())["rename_map"] == {FRONT: TOP}
    config = json.loads((pretrained / "config.json").read_text())
    assert set(config["input_features"]) == {"observation.state", TOP}  # the checkpoint's names


def test_the_statistics_follow_the_rename(runs):
    """The ``front`` dataset's camera statistics normalise the camera under the checkpoint's name, ``top``
    (LeRobot's ``rename_stats``)."""
    pretrained = runs["tuned"] / "pretrained_model"
    (file,) = pretrained.glob("policy_preprocessor_step_*_normalizer_processor.safetensors")
    saved = load_file(str(file))
    assert not any(k.startswith(FRONT) for k in saved)
    stats = json.loads((runs["front"] / "meta" / "stats.json").read_text())
    for stat in ("mean", "std"):
        want = torch.tensor(stats[FRONT][stat], dtype=torch.float32).reshape(3, 1, 1)
        torch.testing.assert_close(saved[f"{TOP}.{stat}"].reshape(3, 1, 1), want)


def test_our_loader_feeds_the_datasets_names_to_the_checkpoint(runs):
    pretrained = runs["tuned"] / "pretrained_model"
    pre, _ = load_processors(pretrained)
    _, policy = load_pretrained(pretrained)
    g = torch.Generator().manual_seed(0)
    image = torch.rand((2, 3, *SHAPE[:2]), generator=g)
    batch = {FRONT: image, "observation.state": torch.randn((2, 3), generator=g)}
    out = pre(batch)
    assert FRONT not in out and TOP in out
    stats = json.loads((runs["front"] / "meta" / "stats.json").read_text())[FRONT]
    mean, std = (torch.tensor(stats[s], dtype=torch.float32).reshape(1, 3, 1, 1) for s in ("mean", "std"))
    torch.testing.assert_close(out[TOP], (image - mean) / (std + 1e-8))
    with torch.no_grad():
        assert policy.predict_action_chunk(out).shape == (2, 5, 2)


def test_a_resume_keeps_the_map_and_a_fine_tune_without_it_clears_it(runs, tmp_path):
    """As LeRobot's override of a pretrained pre-processor: the run's own map, ``{}`` when none is given."""
    config = runs["tuned"] / "pretrained_model" / "train_config.json"
    assert main(["--resume=true", f"--config_path={config}", "--steps=3"]) == 0
    resumed = runs["tuned"].parent / "000003" / "pretrained_model"
    steps = json.loads((resumed / "policy_preprocessor.json").read_text())["steps"]
    assert steps[0]["config"] == {"rename_map": {FRONT: TOP}}
    out = tmp_path / "again"
    tuned = runs["tuned"] / "pretrained_model"
    assert main([*data(runs["top"], "top"), f"--policy.path={tuned}", *RUN, f"--output_dir={out}"]) == 0
    pretrained = out / "checkpoints" / "last" / "pretrained_model"
    assert json.loads((pretrained / "policy_preprocessor.json").read_text())["steps"][0]["config"] == {
        "rename_map": {}
    }


def test_a_camera_under_another_name_without_the_map_is_one_line_with_the_map(runs, tmp_path, capsys):
    line = refused(
        [*data(runs["front"], "front"), f"--policy.path={runs['base']}", *RUN, f"--output_dir={tmp_path}/o"],
        capsys,
    )
    assert f"{TOP} is missing" in line and f"--rename_map='{json.dumps({FRONT: TOP})}'" in line, line


@pytest.mark.parametrize(
    ("rename", "says"),
    [
        ({"observation.images.nope": TOP}, "renames 'observation.images.nope', which the dataset at"),
        ({FRONT: "observation.images.side"}, "which is not an input of the --policy.path policy"),
        ({"action": "observation.state"}, "only observations are renamed"),
    ],
)
def test_a_map_the_dataset_or_policy_does_not_fit_is_one_line(runs, tmp_path, capsys, rename, says):
    line = refused(
        [
            *data(runs["front"], "front"),
            f"--policy.path={runs['base']}",
            *RUN,
            f"--rename_map={json.dumps(rename)}",
            f"--output_dir={tmp_path}/o",
        ],
        capsys,
    )
    assert line.startswith("lerobot-train: error: --rename_map") and says in line, line
    assert not (tmp_path / "o").exists()


def test_a_map_without_a_pretrained_policy_is_refused_as_in_lerobot(runs, tmp_path, capsys):
    line = refused(
        [*data(runs["front"], "front"), *ACT, *RUN, f"--rename_map={MAP}", f"--output_dir={tmp_path}/o"],
        capsys,
    )
    assert "--rename_map" in line and "needs one: a fresh --policy.type policy" in line, line


def test_two_features_under_one_name_are_refused():
    features = {FRONT: {}, TOP: {}, "observation.images.side": {}}
    inputs = {TOP: None}
    with pytest.raises(ValueError, match="which the dataset at d already has"):
        check_rename_map({FRONT: TOP}, features, inputs, "d")
    with pytest.raises(ValueError, match="to one name"):
        check_rename_map({FRONT: TOP, "observation.images.side": TOP}, features, inputs, "d")
    check_rename_map({FRONT: TOP, TOP: FRONT}, features, {TOP: None, FRONT: None}, "d")  # a swap is fine


def test_the_suggestion_pairs_missing_inputs_with_spare_observations_of_their_type():
    cam, state = PolicyFeature(FeatureType.VISUAL, (3, 8, 8)), PolicyFeature(FeatureType.STATE, (3,))
    inputs = {TOP: cam, "observation.images.wrist": cam, "observation.state": state}
    available = {FRONT: cam, "observation.images.hand": cam, "observation.state": state}
    assert suggested_map([TOP, "observation.images.wrist"], inputs, available, {}) == {
        FRONT: TOP,
        "observation.images.hand": "observation.images.wrist",
    }
    assert suggested_map([TOP], inputs, {"observation.state": state}, {}) is None
