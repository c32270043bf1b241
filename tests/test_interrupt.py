"""SIGINT/SIGTERM to the launcher: every rank stops at the same step, a checkpoint is saved, resume works."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
ARGS = ["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}", "--num_workers=0", "--policy.type=mlp",
        "--policy.hidden_dim=32", "--batch_size=4", "--log_freq=1", "--save_freq=0", "--steps=100000",
        "--accelerator.gradient_accumulation.steps=4"]

pytestmark = pytest.mark.slow


def start(launch, cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=launch.clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def wait_for_steps(out: Path, n: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError(f"no {n} steps within {timeout_s}s")


CASES = [(1, signal.SIGINT), (2, signal.SIGTERM)]


def interrupt(launch, out: Path, nproc: int, sig: signal.Signals) -> tuple[int, str, str]:
    """Train until 5 steps are logged, signal the launcher (or the single process); its code and output."""
    if nproc == 1:
        cmd = [SCRIPT, *ARGS, f"--output_dir={out}"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               f"--master-port={launch.free_port()}", SCRIPT, *ARGS, f"--output_dir={out}"]
    proc = start(launch, cmd)
    try:
        wait_for_steps(out, 5, proc)
        os.kill(proc.pid, sig)  # the launcher (or the single process) gets the signal
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, stdout, stderr


@pytest.fixture(scope="module")
def interrupted(launch, tmp_path_factory):
    """Every case's interrupted run (each its own launch), then the resumes of those that left a
    checkpoint in ONE launch (all resume on one process). Per case: (out, rc, stdout, stderr, the step
    ``last`` was on after the interrupt (None: no checkpoint), the resume's output)."""
    root = tmp_path_factory.mktemp("interrupt")
    runs = {}
    for nproc, sig in CASES:
        out = root / f"{nproc}-{sig.name}" / "run"
        runs[(nproc, sig)] = (out, *interrupt(launch, out, nproc, sig))
    resumable = {}
    for case, (out, *_) in runs.items():
        state = out / "checkpoints" / "last" / "training_state" / "training_step.json"
        if state.is_file():
            resumable[case] = json.loads(state.read_text())["step"]
    outs = launch.lerobot_train_runs(
        *(["--resume=true", f"--config_path={runs[c][0] / 'checkpoints' / 'last'}", f"--steps={step + 4}"]
          for c, step in resumable.items())) if resumable else []
    resumed = dict(zip(resumable, outs, strict=True))
    return {case: (*run, resumable.get(case), resumed.get(case)) for case, run in runs.items()}


@pytest.mark.parametrize(("nproc", "sig"), CASES)
def test_signal_saves_a_consistent_checkpoint_and_resume_continues(interrupted, nproc, sig):
    out, returncode, stdout, stderr, step, res = interrupted[(nproc, sig)]
    assert returncode != 0, (stdout, stderr)
    if nproc == 1:  # the guide's promise; torchrun reports its own code for the job
        assert returncode == 128 + sig, (returncode, stdout, stderr)
    assert stdout.count(f"interrupted by {sig.name}") == 1, (stdout, stderr)  # one common stop, said once
    # `last`'s training_step.json, read before the resume moved `last` on
    assert step is not None, f"no checkpoint in {out}:\n{stdout}\n{stderr}"
    assert step >= 5 and f"at step {step}" in stdout
    assert step % 4 == 0  # the interrupt finished its accumulation window, so the checkpoint resumes exactly
    # resumed from it, a few more steps (the cases' resumes share one launch, which asserts they succeeded)
    assert res is not None
    assert f"resuming at step {step}" in res.stdout
    assert (out / "checkpoints" / f"{step + 4:06d}").is_dir()
