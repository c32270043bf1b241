"""Publishing the final policy: exactly which files would go to the Hub (only the transport is faked)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")

FAKE_HUB_DIR = Path(__file__).resolve().parent / "fake_hub"  # sitecustomize.py records Hub calls


@pytest.mark.slow
def test_final_policy_is_published_from_the_main_rank_only(launch, tmp_path):
    log = tmp_path / "hub.jsonl"
    out = tmp_path / "run"
    res = launch.torchrun(
        SCRIPT,
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--num_workers=0",
        "--policy.type=mlp",
        "--policy.repo_id=me/demo_policy",
        "--policy.private=true",
        "--steps=3",
        "--ema.enable=true",
        "--log_freq=0",
        f"--output_dir={out}",
        nproc=2,
        timeout_s=180,
        env={"PYTHONPATH": str(FAKE_HUB_DIR), "FAKE_HUB_LOG": str(log)},
    )
    assert res.returncode == 0, res.describe()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # whoami at start-up (can the upload happen at all?), the upload after the last step, then the EMA
    # weights to <repo_id>-ema (LeRobot's)
    assert [c["call"] for c in calls] == [
        "whoami",
        "create_repo",
        "create_commit",
        "create_repo",
        "create_commit",
    ]
    assert {c["rank"] for c in calls} == {"0"}
    assert calls[1] == {"call": "create_repo", "rank": "0", "repo_id": "me/demo_policy", "private": True}
    files = calls[2]["files"]
    assert sorted(files) == sorted(
        [
            "README.md",
            "config.json",
            "model.safetensors",
            "train_config.json",
            "policy_preprocessor.json",
            "policy_preprocessor_step_3_normalizer_processor.safetensors",
            "policy_postprocessor.json",
            "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
        ]
    )
    card = files["README.md"]
    assert "| effective batch | 8 x 2 dp workers x 1 grad accum = 16 |" in card
    assert "dp_replicate=2 x dp_shard=1 (ddp)" in card and "lerobot/demo_reach" in card
    assert "published to me/demo_policy" in res.stdout
    assert calls[3] == {"call": "create_repo", "rank": "0", "repo_id": "me/demo_policy-ema", "private": True}
    assert sorted(calls[4]["files"]) == sorted(files)
    assert "the EMA of the weights published as `me/demo_policy`" in calls[4]["files"]["README.md"]
    assert "published the EMA weights to me/demo_policy-ema" in res.stdout


def test_publishing_a_dcp_only_checkpoint_is_refused_up_front(tmp_path):
    import subprocess

    proc = subprocess.run(
        [
            SCRIPT,
            "--dataset.repo_id=lerobot/demo_reach",
            f"--dataset.root={DEMO}",
            "--policy.type=mlp",
            "--policy.repo_id=me/p",
            "--checkpoint_format=dcp",
            f"--output_dir={tmp_path / 'o'}",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 2 and "--checkpoint_format=dcp" in proc.stderr and "Traceback" not in proc.stderr
    )
