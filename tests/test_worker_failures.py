"""A DataLoader worker that dies under the real ``lerobot-train`` ends the run with one line, no traceback.

The worker is killed from outside with SIGKILL, as the kernel's out-of-memory killer does, once the run has
written a checkpoint: torch's own report was a 27- to 48-line ``RuntimeError`` traceback from wherever the
training process was (often inside the backward pass) naming a pid alone. The line names the worker, the
signal, the likely cause with what ``--num_workers`` costs, and the checkpoint to resume from; the exit code
is 1 (a failed run, as a failed checkpoint write), not 2 (a usage error). An error a worker raises (a dataset
problem) is the bad-input table's row ``dataset-error-raised-in-a-worker`` (tests/data/bad_inputs.json).
One process, a tiny ACT on the demo dataset, one worker.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = str(Path(sys.executable).parent / "lerobot-train")
STARTUP_S = 240  # importing torch and building the run on 2 shared cores; only bounds the wait
ACT = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=1",
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_encoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
    "--batch_size=2",
    "--log_freq=0",
    "--save_freq=2",
    "--steps=1000000",
]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc, fork")


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (its DataLoader workers: the training process forks no other)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(name))
    return found


def _wait_for(what: str, ready, proc: subprocess.Popen, timeout_s: float):
    """Poll ``ready()`` until it returns something truthy; fail if the run ends or the time is up first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := ready():
            return value
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {what}"
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout_s} s")


def test_a_worker_killed_by_the_oom_killer_is_one_line_naming_it_and_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    log_out, log_err = tmp_path / "stdout", tmp_path / "stderr"
    with log_out.open("w") as stdout, log_err.open("w") as stderr:
        proc = subprocess.Popen(
            [SCRIPT, *ACT, f"--output_dir={out}"],
            stdout=stdout,
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        )
    try:
        _wait_for("a checkpoint", lambda: (out / "checkpoints" / "last").exists(), proc, STARTUP_S)
        (worker,) = _wait_for("the worker", lambda: _children(proc.pid), proc, 30)
        os.kill(worker, signal.SIGKILL)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr_text, output = log_err.read_text(), log_out.read_text() + log_err.read_text()
    lines = [line for line in stderr_text.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1, f"rc {proc.returncode}\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    (line,) = lines
    assert line.startswith(f"lerobot-train: error: DataLoader worker 0 (pid {worker}) was killed by SIGKILL ")
    assert "out-of-memory killer" in line and "each of the --num_workers=1 workers" in line, line
    named = re.search(r"last checkpoint: (\S+) \(continue with --resume=true --config_path=(\S+)\)$", line)
    assert named and named[1] == named[2], line
    # the newest committed checkpoint: the one `last` points at now that the run is over
    assert Path(named[1]) == (out / "checkpoints" / "last").resolve(), line
