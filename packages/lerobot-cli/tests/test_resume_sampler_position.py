"""A checkpoint's saved data position is checked before a resume loads anything: a ``sampler.offset``
or ``sampler.epoch`` out of range or of another type in ``training_step.json`` is one line naming the
file and the entry (exit 2), not the sampler's traceback after the weights are in place. In-process,
a small MLP on the demo dataset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from lerobot_cli.train import main

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
MLP = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=mlp",
    "--policy.hidden_dim=16",
    "--batch_size=2",
    "--steps=1",
    "--log_freq=0",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("sampler") / "run"
    assert main([*MLP, f"--output_dir={run}"]) == 0
    return run / "checkpoints" / "000001"


@pytest.mark.parametrize(
    ("key", "value"),
    [("offset", -7), ("offset", 10**18), ("offset", "3"), ("epoch", -1), ("epoch", 1.5), ("seed", "x")],
)
def test_a_sampler_position_out_of_range_is_one_line(checkpoint, tmp_path, capsys, key, value):
    step = tmp_path / "run" / "checkpoints" / "000001"
    shutil.copytree(checkpoint.parents[1], tmp_path / "run", symlinks=True)
    record = step / "training_state" / "training_step.json"
    data = json.loads(record.read_text())
    data["sampler"][key] = value
    record.write_text(json.dumps(data))
    capsys.readouterr()
    config = step / "pretrained_model" / "train_config.json"
    with pytest.raises(SystemExit) as exited:
        main(["--resume=true", f"--config_path={config}", "--steps=2"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not line.startswith("lerobot-train: warning:")]
    assert "Traceback" not in err and len(errors) == 1, err
    assert errors[0].startswith("lerobot-train: error: ") and str(record) in errors[0], err
    assert f"sampler.{key} is" in errors[0], err
    assert not (tmp_path / "run" / "checkpoints" / "000002").exists()


def test_the_untouched_position_resumes(checkpoint, tmp_path):
    shutil.copytree(checkpoint.parents[1], tmp_path / "run", symlinks=True)
    config = tmp_path / "run" / "checkpoints" / "000001" / "pretrained_model" / "train_config.json"
    assert main(["--resume=true", f"--config_path={config}", "--steps=2"]) in (0, None)
    assert (tmp_path / "run" / "checkpoints" / "000002").is_dir()
