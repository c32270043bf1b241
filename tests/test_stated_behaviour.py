"""What the README and the guide say a run does, checked on real ``lerobot-train`` runs.

* A resume can turn activation checkpointing off with ``--accelerator.activation_checkpointing.mode=none``
  (the documented default; the parser used to read ``none`` as null and refuse it).
* A checkpoint write the disk refuses ends the run with one line naming the file (the guide's promise;
  files written with ``write_text`` used to be reported as a bare "OSError: [Errno 27] File too large").
  The disk is made to refuse with RLIMIT_FSIZE, as tests/test_drills.py does, but below the size of
  ``config.json``, the first file a save writes, where the drills' limit only reaches the weights.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
MLP = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=mlp",
    "--policy.hidden_dim=32",
    "--batch_size=4",
    "--log_freq=0",
]
SET_FILE_LIMIT = (
    "import os, resource, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
LIMIT = 1000  # below config.json (~1.2 kB), above everything a resume writes before its save


def _tree(root: Path) -> dict[str, bytes | str]:
    return {
        str(p.relative_to(root)): (
            f"-> {p.readlink()}" if p.is_symlink() else "<dir>" if p.is_dir() else p.read_bytes()
        )
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def runs(launch, tmp_path_factory):
    """One launch: a run with full activation checkpointing and its resume with none, and the base of the
    write-failure drill; then that drill's resume under the file-size limit (it must fail)."""
    root = tmp_path_factory.mktemp("stated")
    ac, disk = root / "ac", root / "disk"
    full, resumed, _ = launch.lerobot_train_runs(
        [*MLP, "--steps=2", "--accelerator.activation_checkpointing.mode=full", f"--output_dir={ac}"],
        [
            "--resume=true",
            f"--config_path={ac / 'checkpoints' / 'last'}",
            "--steps=4",
            "--accelerator.activation_checkpointing.mode=none",
        ],
        [*MLP, "--steps=2", f"--output_dir={disk}"],
    )
    before = _tree(disk / "checkpoints")
    hurt = launch.run_command(
        [
            launch.PYTHON,
            "-c",
            SET_FILE_LIMIT,
            str(LIMIT),
            SCRIPT,
            "--resume=true",
            f"--config_path={disk / 'checkpoints' / 'last'}",
            "--steps=4",
        ],
        timeout_s=180,
    )
    return {
        "ac": ac,
        "full": full,
        "resumed": resumed,
        "disk": disk,
        "before": before,
        "hurt": hurt,
        "after": _tree(disk / "checkpoints"),
    }


def test_a_resume_turns_activation_checkpointing_off(runs):
    assert "Activation checkpointing: full" in runs["full"].stdout
    assert "resuming at step 2" in runs["resumed"].stdout
    assert "Activation checkpointing" not in runs["resumed"].stdout and runs["resumed"].stderr.strip() == ""
    saved = json.loads(
        (runs["ac"] / "checkpoints" / "000004" / "pretrained_model" / "train_config.json").read_text()
    )
    assert saved["accelerator"]["activation_checkpointing"]["mode"] == "none"


def test_a_refused_checkpoint_write_names_the_file(runs):
    hurt = runs["hurt"]
    assert hurt.returncode == 1 and not hurt.timed_out, hurt.describe()
    errors = [ln for ln in hurt.stderr.splitlines() if ln.startswith("lerobot-train: error: ")]
    assert len(errors) == 1 and "Traceback" not in hurt.output, hurt.describe()
    assert "checkpoint 000004 was not saved (the previous checkpoint and `last` are unchanged): " in errors[0]
    assert re.search(
        r"could not write \S+/pretrained_model/config\.json: OSError: \[Errno 27\] File too large$", errors[0]
    ), errors[0]
    assert runs["after"] == runs["before"]  # step 2 and `last` as they were, no staging debris
