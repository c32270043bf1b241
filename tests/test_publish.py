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

# Loaded at interpreter start-up in every launched process (PYTHONPATH): the real huggingface_hub code
# path runs, only its two network calls are replaced by recorders.
FAKE_HUB = '''
import json, os, huggingface_hub
LOG = os.environ["FAKE_HUB_LOG"]
def _record(kind, **kw):
    with open(LOG, "a") as f:
        f.write(json.dumps({"call": kind, "rank": os.environ.get("RANK", "0"), **kw}) + "\\n")
def create_repo(self, repo_id, **kw):
    _record("create_repo", repo_id=repo_id, private=kw.get("private"))
def create_commit(self, repo_id, operations, **kw):
    files = {}
    for op in operations:
        src = op.path_or_fileobj
        files[op.path_in_repo] = src.decode() if isinstance(src, bytes) else os.path.basename(src)
    _record("create_commit", repo_id=repo_id, files=files)
huggingface_hub.HfApi.create_repo = create_repo
huggingface_hub.HfApi.create_commit = create_commit
'''


@pytest.mark.slow
def test_final_policy_is_published_from_the_main_rank_only(launch, tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(FAKE_HUB)
    log = tmp_path / "hub.jsonl"
    out = tmp_path / "run"
    res = launch.torchrun(
        SCRIPT, "--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}", "--num_workers=0",
        "--policy.type=mlp", "--policy.repo_id=me/demo_policy", "--policy.private=true", "--steps=3",
        "--log_freq=0", f"--output_dir={out}", nproc=2, timeout_s=180,
        env={"PYTHONPATH": str(fake), "FAKE_HUB_LOG": str(log)},
    )
    assert res.returncode == 0, res.describe()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["call"] for c in calls] == ["create_repo", "create_commit"]
    assert {c["rank"] for c in calls} == {"0"}
    assert calls[0] == {"call": "create_repo", "rank": "0", "repo_id": "me/demo_policy", "private": True}
    files = calls[1]["files"]
    assert sorted(files) == sorted([
        "README.md", "config.json", "model.safetensors", "train_config.json", "policy_preprocessor.json",
        "policy_preprocessor_step_3_normalizer_processor.safetensors", "policy_postprocessor.json",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
    ])
    card = files["README.md"]
    assert "| effective batch | 8 x 2 dp workers x 1 grad accum = 16 |" in card
    assert "dp_replicate=2 x dp_shard=1 (ddp)" in card and "lerobot/demo_reach" in card
    assert "published to me/demo_policy" in res.stdout


def test_publishing_a_dcp_only_checkpoint_is_refused_up_front(tmp_path):
    import subprocess

    proc = subprocess.run([SCRIPT, "--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}",
                           "--policy.type=mlp", "--policy.repo_id=me/p", "--checkpoint_format=dcp",
                           f"--output_dir={tmp_path / 'o'}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--checkpoint_format=dcp" in proc.stderr and "Traceback" not in proc.stderr
