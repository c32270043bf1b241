"""``--save_checkpoint_to_hub``: each committed checkpoint uploaded by the main rank to
``checkpoints/<step>/`` of ``--policy.repo_id``, tagged with the step (LeRobot's layout), also with
``--checkpoint_async``; a failed upload is one warning and training goes on. The Hub's transport is faked
(tests/fake_hub: the real huggingface_hub code path, its network calls recorded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent / "data" / "lerobot" / "demo_reach"
RUN = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=mlp",
    "--policy.hidden_dim=16",
    "--batch_size=4",
    "--save_checkpoint_to_hub=true",
]


@pytest.fixture(scope="module")
def uploads(launch, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("upload")
    log = tmp / "hub.jsonl"
    runs = {
        "sync": [*RUN, "--policy.repo_id=me/sync", "--steps=4", "--save_freq=2"],
        "async": [*RUN, "--policy.repo_id=me/async", "--steps=4", "--save_freq=2", "--checkpoint_async=true"],
        "failing": [*RUN, "--policy.repo_id=me/failing", "--steps=6", "--save_freq=3"],
    }
    env = {
        "PYTHONPATH": str(HERE / "fake_hub"),
        "FAKE_HUB_LOG": str(log),
        "FAKE_HUB_FAIL_COMMIT": "checkpoint 000003",  # the failing run's first upload
    }
    outs = launch.lerobot_train_runs(
        *[[*flags, f"--output_dir={tmp / name}"] for name, flags in runs.items()], nproc=2, env=env
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return tmp, dict(zip(runs, outs, strict=True)), calls


def _calls(calls: list[dict], repo: str) -> list[dict]:
    """The checkpoint uploads' calls for ``repo`` (the final policy's publish, --policy.push_to_hub's
    default, is its own commit)."""
    return [
        c
        for c in calls
        if c.get("repo_id") == repo and c["call"] != "create_repo" and "Upload" not in c.get("message", "")
    ]


@pytest.mark.parametrize("name", ["sync", "async"])
def test_each_checkpoint_is_uploaded_by_the_main_rank_and_tagged(uploads, name):
    tmp, _, calls = uploads
    mine = _calls(calls, f"me/{name}")
    assert {c["rank"] for c in mine} == {"0"}
    commits = [c for c in mine if c["call"] == "create_commit"]
    assert [c["message"] for c in commits] == ["checkpoint 000002", "checkpoint 000004"]
    for commit, step in zip(commits, ("000002", "000004"), strict=True):
        local = tmp / name / "checkpoints" / step
        expected = {
            f"checkpoints/{step}/{p.relative_to(local).as_posix()}"
            for p in local.rglob("*")
            if p.is_file() and not p.is_symlink()
        }
        assert set(commit["files"]) == expected  # the whole checkpoint, training state included
        assert f"checkpoints/{step}/pretrained_model/model.safetensors" in expected
        assert f"checkpoints/{step}/training_state/training_step.json" in expected
    assert [c["tag"] for c in mine if c["call"] == "create_tag"] == ["000002", "000004"]


def test_a_failed_upload_is_one_warning_and_training_goes_on(uploads):
    tmp, outs, calls = uploads
    mine = _calls(calls, "me/failing")
    assert [c["call"] for c in mine if "commit" in c["call"]] == ["create_commit_failed", "create_commit"]
    assert [c["tag"] for c in mine if c["call"] == "create_tag"] == ["000006"]
    warned = [line for line in outs["failing"].stderr.splitlines() if "uploading checkpoint" in line]
    assert len(warned) == 1 and "000003 to me/failing failed (OSError" in warned[0], warned
    assert "it is on disk" in warned[0] and (tmp / "failing/checkpoints/000006").is_dir()
