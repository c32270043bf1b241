"""A Hub dataset that is not cached is downloaded once per machine, by its local main rank, while the
other ranks wait; then every rank reads the cache (real ``huggingface_hub`` code path, its transport
replaced by tests/fake_hub). And when that download fails, the job says so in one line, once."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
FAKE_HUB_DIR = REPO / "tests" / "fake_hub"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")

pytestmark = pytest.mark.slow

ARGS = [
    "--dataset.repo_id=me/reach",
    "--num_workers=0",
    "--policy.type=mlp",
    "--policy.hidden_dim=16",
    "--steps=2",
    "--log_freq=1",
    "--save_checkpoint=false",
    "--batch_size=4",
]


def test_one_download_per_machine_by_the_local_main_rank(launch, tmp_path):
    hub = tmp_path / "hub"
    shutil.copytree(DEMO, hub / "me" / "reach")
    log = tmp_path / "calls.jsonl"
    env = {
        "PYTHONPATH": str(FAKE_HUB_DIR),
        "FAKE_HUB_LOG": str(log),
        "FAKE_HUB_DATASETS": str(hub),
        "HF_LEROBOT_HOME": str(tmp_path / "home"),
    }
    res = launch.torchrun(SCRIPT, *ARGS, f"--output_dir={tmp_path / 'run'}", nproc=2, env=env, timeout_s=180)
    assert not res.timed_out and res.returncode == 0, res.describe()
    calls = [json.loads(ln) for ln in log.read_text().splitlines()]
    downloads = [c for c in calls if c["call"] == "snapshot_download"]
    assert [(c["rank"], c["local_rank"]) for c in downloads] == [("0", "0")]  # once, by the local main rank
    assert (tmp_path / "home" / "me" / "reach" / "meta" / "info.json").is_file()
    assert "step 2/2" in res.stdout

    offline = tmp_path / "offline"
    res = launch.torchrun(
        SCRIPT,
        "--dataset.repo_id=me/absent",
        *ARGS[1:],
        f"--output_dir={offline}",
        nproc=2,
        env=env,
        timeout_s=180,
    )
    assert res.returncode != 0 and not res.timed_out
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("lerobot-train: error:")]
    assert len(errors) == 1 and "dataset 'me/absent' not found" in errors[0], res.stderr
    absent = [c for c in map(json.loads, log.read_text().splitlines()) if c.get("repo_id") == "me/absent"]
    assert [c["rank"] for c in absent] == ["0"]  # the other rank did not try the network itself
    assert "lerobot_cli/" not in res.stderr  # no traceback from our code (torchrun prints its own)
