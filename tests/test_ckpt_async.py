"""``--checkpoint_async=true`` on the real ``lerobot-train`` (torchrun x2 DDP, gloo): training goes on
while a save is in flight, a kill -9 during the background write leaves ``last`` on the previous
complete checkpoint, and the run resumes from it (with the flag read back from train_config.json).

The background phase is slowed with ``LEROBOT_CKPT_TEST_COMMIT_DELAY_S`` (lerobot_ckpt.save: the
real code path, paused before its writers), so each save stays in flight for seconds while the
loop runs ~50 steps/s. The library-level checks (snapshot = save step's state, same files as a
synchronous save, failures) are packages/lerobot-ckpt/tests/test_ckpt_async.py and the FSDP2
scenario of tests/test_ckpt_sharded_resume.py; the failed background write of a real run is the
``async`` case of tests/test_drills.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
STARTUP_S = 180
DELAY_S = 2.0

pytestmark = pytest.mark.slow


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"lerobot_tests_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


drill_job = _load("drill_job")
MLP, metrics_lines = drill_job.MLP, drill_job.metrics_lines


def _listing(ckpts: Path) -> tuple[set[int], list[str], str | None]:
    """Committed step directories, dot-named staging directories, and where ``last`` points."""
    try:
        entries = list(ckpts.iterdir())
    except FileNotFoundError:
        return set(), [], None
    steps = {int(p.name) for p in entries if re.fullmatch(r"\d+", p.name) and not p.is_symlink()}
    staging = sorted(p.name for p in entries if p.name.startswith(".tmp-"))
    last = os.readlink(ckpts / "last") if (ckpts / "last").is_symlink() else None
    return steps, staging, last


def test_training_runs_during_a_background_save_and_kill_9_leaves_last_on_the_previous_one(launch, tmp_path):
    out = tmp_path / "run"
    ckpts = out / "checkpoints"
    port = launch.free_port()
    cmd = [
        launch.PYTHON,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        f"--master-port={port}",
        "--monitor-interval=0.2",
        SCRIPT,
        *MLP,
        "--steps=1000000",
        "--log_freq=1",
        "--save_freq=40",
        "--checkpoint_async=true",
        f"--output_dir={out}",
    ]
    job = drill_job.DrillJob(
        cmd, tmp_path, launch.clean_env({"LEROBOT_CKPT_TEST_COMMIT_DELAY_S": str(DELAY_S)}), port, launch
    )
    try:
        job.wait_for(lambda: bool(_listing(ckpts)[0]), STARTUP_S, "a first committed checkpoint")
        # A save in flight: its staging directory exists, `last` is on a committed step before it.
        deadline = time.monotonic() + 60
        while True:
            steps, staging, last = _listing(ckpts)
            if staging and last is not None:
                break
            assert time.monotonic() < deadline and job.proc.poll() is None, job.output()
            time.sleep(0.02)
        t_seen, lines_seen = time.monotonic(), metrics_lines(out)
        time.sleep(DELAY_S / 2)  # still inside the background phase (it waits DELAY_S before writing)
        lines_later = metrics_lines(out)
        _, staging_k, last_k = _listing(ckpts)
        ranks = job.find_workers(2)
        for pid in ranks.values():  # kill -9 of the job: both ranks, then the launcher
            os.kill(pid, signal.SIGKILL)
        os.kill(job.proc.pid, signal.SIGKILL)
        job.wait_end(30)
        t_kill = time.monotonic()
        output = job.output()
    finally:
        job.close()
    print(
        f"\n[async drill] staging {staging} seen with last -> {last} at {lines_seen} loop steps; "
        f"{t_kill - t_seen:.2f} s later, at the kill: {lines_later} steps, "
        f"staging {staging_k}, last -> {last_k}"
    )
    assert "(writing in the background)" in output, output[-3000:]
    # (a) the loop kept stepping while the save was in flight (the staging directory still there,
    # `last` unchanged)
    assert lines_later - lines_seen >= 5 and staging_k == staging and last_k == last, output[-3000:]

    # (b) `last` is the previous complete checkpoint; the staged one was never committed
    steps, staging_after, last_after = _listing(ckpts)
    staged_step = int(staging_k[0].split("-")[1])
    assert last_after == last_k and int(last_after) == max(steps) < staged_step
    assert staging_after == staging_k and not (ckpts / f"{staged_step:06d}").exists()
    record = json.loads((ckpts / "last" / "training_state" / "training_step.json").read_text())
    assert record["step"] == int(last_after)
    saved_cfg = json.loads((ckpts / "last" / "pretrained_model" / "train_config.json").read_text())
    assert saved_cfg["checkpoint_async"] is True  # (e) the flag round-trips through train_config.json

    resumed_to = int(last_after) + 4
    again = launch.torchrun(
        SCRIPT,
        "--resume=true",
        f"--config_path={ckpts / 'last'}",
        f"--steps={resumed_to}",
        "--log_freq=0",
        nproc=2,
        timeout_s=180,
    )
    assert again.returncode == 0, again.describe()
    assert f"resuming at step {int(last_after)}" in again.stdout, again.describe()
    assert f"removed what an interrupted save left in {ckpts}: {staging_k[0]}" in again.stderr, (
        again.describe()
    )
    assert (
        f"checkpoint: {ckpts / f'{resumed_to:06d}'} (writing in the background)" in again.stdout
    )  # async again
    steps, staging_end, last_end = _listing(ckpts)
    assert last_end == f"{resumed_to:06d}" and staging_end == []
    record = json.loads((ckpts / "last" / "training_state" / "training_step.json").read_text())
    assert record["step"] == resumed_to


def test_an_interrupt_waits_for_its_background_save_before_exiting(launch, tmp_path):
    """SIGINT: the interrupt's own save goes to the background (held DELAY_S before writing) and the
    process exits only once it committed. Without that wait the daemon writer would die with the
    process and no checkpoint would exist at all (save_freq=0: the interrupt's is the only one)."""
    out = tmp_path / "run"
    cmd = [
        SCRIPT,
        *MLP,
        "--log_freq=1",
        "--save_freq=0",
        "--steps=100000",
        "--checkpoint_async=true",
        f"--output_dir={out}",
    ]
    env = launch.clean_env({"LEROBOT_CKPT_TEST_COMMIT_DELAY_S": str(DELAY_S)})
    job = drill_job.DrillJob(cmd, tmp_path, env, launch.free_port(), launch)
    try:
        job.wait_for(lambda: metrics_lines(out) >= 5, STARTUP_S, "five loop steps")
        t0 = time.monotonic()
        os.kill(job.proc.pid, signal.SIGINT)
        ended = job.wait_end(60)
        output = job.output()
    finally:
        job.close()
    assert ended is not None and job.proc.returncode == 128 + signal.SIGINT, output[-3000:]
    # No timing bound: without the wait the process still took ~2 s to end (interpreter and torch teardown
    # on a loaded machine) and no checkpoint existed. What shows the wait is the committed checkpoint below:
    # a daemon writer cannot commit after its process is gone.
    step = json.loads((out / "checkpoints" / "last" / "training_state" / "training_step.json").read_text())[
        "step"
    ]
    assert f"checkpoint: {out / 'checkpoints' / f'{step:06d}'} (writing in the background)" in output
    assert _listing(out / "checkpoints")[1] == []  # committed, no staging directory left
    print(
        f"\n[async interrupt] SIGINT -> exit {job.proc.returncode} after {time.monotonic() - t0:.1f} s, "
        f"checkpoint {step:06d} committed"
    )
