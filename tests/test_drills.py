"""Reliability drills on the real ``lerobot-train``: a rank killed or frozen mid-training, a disk
that refuses a checkpoint. Each drill measures what a user would: how long until the whole job is
gone, its exit code, and whether the output says which rank (or which file) failed.

Timings are printed (run with ``-s``) because they are the drill's result, not only its pass mark.
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
REPO = HERE.parent
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
STARTUP_S = 240  # 4 ranks importing torch on 2 shared cores; only bounds the wait for the first step

pytestmark = pytest.mark.slow


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"lerobot_tests_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


drill_job = _load("drill_job")
MLP, metrics_lines = drill_job.MLP, drill_job.metrics_lines


def _start_training(launch, tmp_path: Path, nproc: int, *extra: str):
    """A DDP run far too long to finish; returns once every rank is inside the step loop.

    Metrics are reduced over all ranks before the main rank writes a line, so two lines in
    metrics.jsonl prove that every rank has completed collectives in the loop.
    """
    out = tmp_path / "run"
    port = launch.free_port()
    cmd = [
        launch.PYTHON,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--master-port={port}",
        "--monitor-interval=0.2",
        SCRIPT,
        *MLP,
        "--steps=1000000",
        "--log_freq=1",
        "--save_checkpoint=false",
        f"--output_dir={out}",
        *extra,
    ]
    job = drill_job.DrillJob(cmd, tmp_path, launch.clean_env(), port, launch)
    job.wait_for(lambda: metrics_lines(out) >= 2, STARTUP_S, "two metrics lines")
    return job


@pytest.mark.parametrize("nproc", [2, 4])
def test_sigkill_of_one_rank_ends_the_job_within_60s_naming_the_rank(launch, tmp_path, nproc):
    job = _start_training(launch, tmp_path, nproc)
    try:
        victim = nproc - 1
        pid = job.find_workers(nproc)[victim]
        os.kill(pid, signal.SIGKILL)
        ended_after = job.wait_end(90)
        left = job.alive_workers()
        output = job.output()
    finally:
        job.close()
    summary = output[output.rindex("FAILED") :] if "FAILED" in output else ""
    exits = re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*exitcode\s*:\s*(-?\d+)", summary)
    reports = [ln[:160] for ln in output.splitlines() if re.match(r"\[rank \d+/\d+\] failed with", ln)]
    print(
        f"\n[drill sigkill nproc={nproc}] rank {victim} (pid {pid}) killed -> job ended after "
        f"{ended_after if ended_after is None else round(ended_after, 1)} s, rc={job.proc.returncode}; "
        f"torchrun summary (rank, exitcode): {exits}\n  " + "\n  ".join(reports)
    )
    assert ended_after is not None and ended_after < 60, output[-4000:]
    assert left == [], f"ranks {left} outlived the launcher"
    assert job.proc.returncode != 0
    # torchrun's failure summary lists every failed rank; the victim must be there, killed by signal 9
    # (usually as the root cause; a survivor that failed on the broken connection is listed too).
    assert re.search(
        rf"rank\s*:\s*{victim} \(local_rank: {victim}\)\s*exitcode\s*:\s*-9 .*SIGKILL", summary
    ), output[-4000:]


def test_a_stopped_rank_hits_the_collective_timeout(launch, tmp_path):
    """SIGSTOP freezes rank 1 inside the loop; rank 0 blocks in its next collective (DDP's gradient
    all-reduce or the metrics all-gather).

    Measured in two parts, because they have different owners: (1) rank 0's collective must time
    out after ``--accelerator.timeout_s`` and the rank must report itself failed: that is ours;
    (2) torchrun then SIGTERMs the frozen rank, which cannot act on it while stopped, so the agent
    waits its fixed 30 s shutdown grace before SIGKILL: that is torchrun's, and bounded, not hidden.
    (torchrun's ``--shutdown-timeout`` does not shorten it: on a worker failure the agent closes the
    others with the hard-coded 30 s default of ``PContext.close``.) The collective timeout is 5 s,
    enough for the ranks' start-up skew on two shared cores; the product accepts any value > 0.
    """
    timeout_s, torchrun_grace_s = 5, 30
    job = _start_training(launch, tmp_path, 2, f"--accelerator.timeout_s={timeout_s}")
    try:
        pid = job.find_workers(2)[1]
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        job.wait_for(
            lambda: "[rank 0/2] failed with" in job.output(),
            timeout_s + 30,
            "rank 0 failure report",
            allow_end=True,
        )
        detected_after = time.monotonic() - t0
        job.wait_for(
            lambda: "closing signal SIGTERM" in job.output(), 30, "torchrun's SIGTERM", allow_end=True
        )
        terminated_after = time.monotonic() - t0  # rank 0 has exited; the agent turns on rank 1
        ended_after = job.wait_end(torchrun_grace_s + 30)
        ended_after = None if ended_after is None else time.monotonic() - t0
        left = job.alive_workers()
        output = job.output()
    finally:
        job.close()
    failure = next((ln for ln in output.splitlines() if ln.startswith("[rank 0/2] failed with")), "")
    print(
        f"\n[drill sigstop] rank 1 (pid {pid}) stopped -> rank 0 reported failure after {detected_after:.1f} "
        f"s: {failure[:300]}\n  -> torchrun SIGTERMs the stopped rank after {terminated_after:.1f} s"
        f"\n  -> job ended after {ended_after if ended_after is None else round(ended_after, 1)} s, "
        f"rc={job.proc.returncode}"
    )
    assert detected_after < timeout_s + 15, output[-4000:]
    assert re.search(r"timed out", failure, re.IGNORECASE), output[-4000:]
    assert ended_after is not None, f"still running after SIGSTOP:\n{output[-4000:]}"
    assert ended_after < detected_after + torchrun_grace_s + 10, output[-4000:]
    assert left == [], f"ranks {left} outlived the launcher"
    assert job.proc.returncode != 0


STEP_DIR = re.compile(r"\d+")


def _committed_steps(ckpts: Path) -> set[str]:
    """Step directories in ``checkpoints/`` (a save is staged under a dot-name until it is renamed)."""
    try:
        return {
            p.name
            for p in ckpts.iterdir()
            if STEP_DIR.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
        }
    except FileNotFoundError:
        return set()


def _wait_for_new_step(job, ckpts: Path, known: set[str], timeout_s: float) -> set[str]:
    """Poll (20 Hz) until a step directory beyond ``known`` is committed; returns the new listing."""
    deadline = time.monotonic() + timeout_s
    while (steps := _committed_steps(ckpts)) <= known:
        assert job.proc.poll() is None, f"job ended (rc={job.proc.returncode}) before saving:\n{job.output()}"
        assert time.monotonic() < deadline, f"no new checkpoint after {timeout_s:.0f} s:\n{job.output()}"
        time.sleep(0.05)
    return steps


@pytest.mark.parametrize("target", ["launcher", "process-group"])
def test_sigkill_of_the_launcher_ends_every_rank_without_a_new_checkpoint(launch, tmp_path, target):
    """``kill -9`` of torchrun (or of its process group, which holds no rank: torchrun starts every
    worker in a session of its own) used to leave the ranks training and saving, orphaned. Each rank
    now watches its parent (lerobot_parallel.watchdog) and hard-exits: no teardown, no save.

    Saves run every ``SAVE_FREQ`` steps (seconds apart at this model's ~100 steps/s), and the kill
    lands right after one is committed, so a rank that kept training would commit the next one
    long before the 30 s bound: the step directories must be exactly those committed at the kill,
    each complete, with ``last`` on the newest. (A kill in the middle of a save leaves only a
    dot-named staging directory: tested with SIGKILLs at random points in test_ckpt_atomic.py.)
    """
    save_freq = 400
    job = _start_training(launch, tmp_path, 2, "--save_checkpoint=true", f"--save_freq={save_freq}")
    ckpts = tmp_path / "run" / "checkpoints"
    try:
        first = _wait_for_new_step(job, ckpts, set(), STARTUP_S)
        at_kill = _wait_for_new_step(job, ckpts, first, 120)  # two saves: the loop saves during the run
        ranks = job.find_workers(2)
        if target == "launcher":
            os.kill(job.proc.pid, signal.SIGKILL)
        else:
            os.killpg(job.proc.pid, signal.SIGKILL)  # DrillJob starts the launcher as a session leader
        t0 = time.monotonic()
        job.proc.wait(10)
        while job.alive_workers() and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        gone_after = time.monotonic() - t0
        left = job.alive_workers()
        output = job.output()
    finally:
        job.close()
    after = _committed_steps(ckpts)
    debris = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("."))
    lines = [ln for ln in output.splitlines() if "is gone; exiting" in ln]
    print(
        f"\n[drill kill launcher, {target}] SIGKILL of pid {job.proc.pid} with rank pids "
        f"{sorted(ranks.values())} training -> every rank gone after {gone_after:.1f} s; "
        f"checkpoints at the kill {sorted(at_kill)}, after {sorted(after)}, staging leftovers {debris}\n  "
        + "\n  ".join(lines)
    )
    assert left == [], f"ranks {left} outlived the launcher by {gone_after:.0f} s:\n{output[-4000:]}"
    assert gone_after < 30, output[-4000:]
    assert sorted(lines) == [
        f"[rank {r}/2] the launcher (pid {job.proc.pid}) is gone; exiting" for r in (0, 1)
    ], output[-4000:]
    assert "failed with" not in output, output[-4000:]  # a peer's exit is not reported as this rank's failure
    assert after == at_kill, (
        f"a checkpoint was committed after the launcher was killed: {sorted(after - at_kill)}"
    )
    newest = max(after, key=int)
    assert (ckpts / "last").resolve().name == newest
    layouts = {
        step: sorted(str(p.relative_to(ckpts / step)) for p in (ckpts / step).rglob("*")) for step in after
    }
    assert all(layout == layouts[newest] for layout in layouts.values()), layouts
    step = json.loads((ckpts / newest / "training_state" / "training_step.json").read_text())
    assert step["step"] == int(newest) and int(newest) % save_freq == 0


SET_FILE_LIMIT = (
    "import os, resource, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: file bytes, link targets, and directories (so staging debris shows)."""
    return {
        str(p.relative_to(root)): (
            f"-> {p.readlink()}" if p.is_symlink() else "<dir>" if p.is_dir() else p.read_bytes()
        )
        for p in sorted(root.rglob("*"))
    }


MODES = ("sync", "async")
# below the weight and optimizer files (the tiny MLP's are ~10 and ~20 KB), above train_config.json (~6 KB
# with every section) and what the resume appends to metrics.jsonl
LIMIT = 8192


@pytest.fixture(scope="module")
def write_failures(launch, tmp_path_factory):
    """Both modes' drills: their first runs share one launch, then each resume under the file-size
    limit runs alone (it must fail), then the two plain resumes share one launch. Per mode: the
    facts the test checks, each taken when the unmerged drill took it."""
    root = tmp_path_factory.mktemp("write_failure")
    out = {mode: root / mode / "run" for mode in MODES}
    args = {
        mode: [*MLP, "--log_freq=1", "--save_freq=2", f"--checkpoint_async={str(mode == 'async').lower()}"]
        for mode in MODES
    }
    launch.lerobot_train_runs(*([*args[m], "--steps=2", f"--output_dir={out[m]}"] for m in MODES))
    facts = {}
    for mode in MODES:
        ckpts = out[mode] / "checkpoints"
        before = _tree(ckpts)
        largest = max(p.stat().st_size for p in ckpts.rglob("*") if p.is_file())
        metrics_size = (out[mode] / "metrics.jsonl").stat().st_size
        resume = ["--resume=true", f"--config_path={ckpts / 'last'}", "--steps=4"]
        hurt = launch.run_command(
            [launch.PYTHON, "-c", SET_FILE_LIMIT, str(LIMIT), SCRIPT, *resume], timeout_s=180
        )
        facts[mode] = {
            "ckpts": ckpts,
            "before": before,
            "largest": largest,
            "metrics_size": metrics_size,
            "hurt": hurt,
            "after_hurt": _tree(ckpts),
            "resume": resume,
        }
    again = launch.lerobot_train_runs(*(facts[m]["resume"] for m in MODES))
    for mode, res in zip(MODES, again, strict=True):
        facts[mode]["again"] = res
    return facts


@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoint_write_failure_keeps_the_previous_checkpoint(write_failures, mode):
    """A resumed run whose next save hits RLIMIT_FSIZE (a full or quota-limited disk, reproducibly).

    SIGXFSZ is ignored in the wrapper (an ignored disposition survives exec), so the write fails
    with EFBIG instead of killing the process: the run must say so in one line, exit non-zero and
    leave step 2 and ``last`` byte-identical, and a plain resume from them must then succeed.
    With ``--checkpoint_async=true`` the training thread writes only the small files of
    ``pretrained_model/`` (all under the limit) and the save returns; the weights fail in the
    background, and the end-of-run wait reports it naming the step.
    """
    f = write_failures[mode]
    ckpts, hurt = f["ckpts"], f["hurt"]
    assert f["largest"] > LIMIT and f["metrics_size"] < LIMIT // 2

    print(
        f"\n[drill write failure, {mode}] rc={hurt.returncode} in {hurt.elapsed_s:.1f} s; stderr:\n"
        f"{hurt.stderr.strip()}"
    )
    assert hurt.returncode not in (0, None) and not hurt.timed_out, hurt.describe()
    errors = [ln for ln in hurt.stderr.splitlines() if ln.startswith("lerobot-train: error: ")]
    assert len(errors) == 1 and re.search(r"File too large|EFBIG|file size", errors[0]), hurt.describe()
    assert "checkpoint 000004 was not saved (the previous checkpoint and `last` are unchanged)" in errors[0]
    assert "Traceback" not in hurt.output, hurt.describe()
    if mode == "sync":
        assert "checkpoint: " not in hurt.stdout  # no save was reported as done
    else:  # reported as started only, and the background write is what failed
        assert [ln for ln in hurt.stdout.splitlines() if ln.startswith("checkpoint: ")] == [
            f"checkpoint: {ckpts / '000004'} (writing in the background)"
        ], hurt.describe()
        assert "model.safetensors" in errors[0]
    assert f["after_hurt"] == f["before"], (
        "the failed save changed the previous checkpoint, `last` or left debris"
    )

    assert "resuming at step 2" in f["again"].stdout
    assert (ckpts / "last").resolve().name == "000004"
    step = json.loads((ckpts / "last" / "training_state" / "training_step.json").read_text())
    assert step["step"] == 4
