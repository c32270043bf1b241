"""A resume publishes only where its own flags say (red team 7).

A checkpoint's ``train_config.json`` is data its sender chose. Its ``policy.repo_id``,
``push_to_hub`` and ``private`` must not make a plain ``--resume=true`` upload the policy to a repo
of theirs: they are taken from the command line only, and when the file named a repo one warning
says it is not published there (a user resuming their own run passes it again). In-process, a tiny
ACT on the demo dataset, Hub offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lerobot_cli.train import main

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
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


@pytest.fixture
def planted(tmp_path, monkeypatch) -> Path:
    """A one-step run whose checkpoint's train_config.json was edited to publish elsewhere."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    run = tmp_path / "run"
    assert main([*ACT, f"--output_dir={run}"]) == 0
    config = run / "checkpoints" / "000001" / "pretrained_model" / "train_config.json"
    data = json.loads(config.read_text())
    data["policy"].update(repo_id="someuser/leaked", push_to_hub=True, private=False)
    config.write_text(json.dumps(data, indent=4))
    return config


def test_a_plain_resume_does_not_publish_where_the_checkpoint_says(planted, capsys):
    capsys.readouterr()
    assert main(["--resume=true", f"--config_path={planted}", "--steps=2"]) == 0
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "not publishing" in ln]
    assert len(notes) == 1 and "--policy.repo_id=someuser/leaked" in notes[0]
    assert "pass it again to publish" in notes[0]
    assert "publishes the final policy" not in err
    saved = planted.parents[2] / "000002" / "pretrained_model" / "train_config.json"
    policy = json.loads(saved.read_text())["policy"]
    assert policy["repo_id"] is None and policy["private"] is None


def test_a_repo_given_again_on_resume_is_published_to(planted, capsys):
    """The flag still counts: here the (offline) upload check refuses it, before any step."""
    with pytest.raises(SystemExit) as info:
        main(["--resume=true", f"--config_path={planted}", "--steps=2", "--policy.repo_id=me/mine"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--policy.repo_id=me/mine publishes the final policy to the Hub" in err
    assert "someuser/leaked" not in err
    assert not (planted.parents[2] / "000002").exists()
