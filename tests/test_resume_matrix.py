"""Resume and the run directory, as a user meets them: every case continues bitwise or says why not.

Each case is a real ``lerobot-train`` run on a copy of one real run, so what is checked is what a
user would see: the losses in ``metrics.jsonl``, the warnings on stderr, the files left on disk.
The matrix: same topology, moved and copied run directories, another batch size, an optimizer
override, a checkpoint saved inside an accumulation window, an older checkpoint with newer ones
beside it (refused, then set aside on request), DDP → FSDP2 at the same world size; and the run
directory's lock (a second run refused, a crashed run's stale lock taken over), interrupted-save
leftovers, and a fresh run over a directory a failed run left. Runs that need nothing between them
share a launch (``launch.lerobot_train_runs``: ``lerobot-train``'s ``main`` per run, one after another),
each with its own stdout and stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
DATA = ["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}", "--num_workers=0"]
MLP = [*DATA, "--policy.type=mlp", "--policy.hidden_dim=32", "--batch_size=4", "--log_freq=1"]
K2 = ["--accelerator.gradient_accumulation.steps=2"]

pytestmark = pytest.mark.slow


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(out)}


COPIED = "continuing the run in "  # every case resumes a copy of a fixture run, which is said once


def warnings_of(stderr: str, copied: bool = False) -> list[str]:
    """The warnings, minus the one that says the run was copied (unless ``copied``)."""
    return [
        ln
        for ln in stderr.splitlines()
        if ln.startswith("lerobot-train: warning:") and (copied or COPIED not in ln)
    ]


def snapshot(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return out


def lerobot_train(launch, *args: str, nproc: int = 1, ok: bool = True):
    if nproc == 1:
        res = launch.run_command([SCRIPT, *args], timeout_s=180)
    else:
        res = launch.torchrun(SCRIPT, *args, nproc=nproc, timeout_s=240)
    assert not res.timed_out, res.describe()
    if ok:
        assert res.returncode == 0, res.describe()
    return res


def resume(launch, checkpoint: Path, *args: str, nproc: int = 1, ok: bool = True):
    return lerobot_train(launch, "--resume=true", f"--config_path={checkpoint}", *args, nproc=nproc, ok=ok)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch):
    """One uninterrupted 8-step run (K=2, checkpoints at 4 and 8) and one that stopped at step 4."""
    root = tmp_path_factory.mktemp("matrix")
    full, half = root / "full", root / "half"
    launch.lerobot_train_runs(
        [*MLP, *K2, "--steps=8", "--save_freq=4", f"--output_dir={full}"],
        [*MLP, *K2, "--steps=4", "--save_freq=4", f"--output_dir={half}"],
    )  # one launch
    return root, full, half


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def resume_flags(checkpoint: Path, *args: str) -> list[str]:
    return ["--resume=true", f"--config_path={checkpoint}", *args]


@pytest.fixture(scope="module")
def resumed(launch, runs) -> dict[str, SimpleNamespace]:
    """The one-process cases that resume a copy of ``half`` and must succeed, each prepared as its test
    says, then run one after another in ONE launch (``launch.lerobot_train_runs``): ``resumed[case]``
    holds the case's directories and ``res``, the run's own stdout and stderr. ``same`` runs first, so
    nothing printed once per process (a Python warning) can be missing from its stderr."""
    root, _, half = runs
    cases: dict[str, SimpleNamespace] = {}
    flags: dict[str, list[str]] = {}

    run = copy_run(half, root / "same")
    cases["same"] = SimpleNamespace(run=run)
    flags["same"] = resume_flags(
        run / "checkpoints" / "last", "--steps=8", "--output_dir=null"
    )  # null: not given

    run = copy_run(half, root / "before_move")
    moved = root / "after_move"
    run.rename(moved)
    cases["moved"] = SimpleNamespace(run=run, moved=moved)
    flags["moved"] = resume_flags(moved / "checkpoints" / "last", "--steps=8")

    original = copy_run(half, root / "original")
    copy = copy_run(original, root / "copy")
    cases["copied"] = SimpleNamespace(original=original, copy=copy, before=snapshot(original))
    flags["copied"] = resume_flags(copy / "checkpoints" / "last", "--steps=8")

    run = copy_run(half, root / "batch")
    cases["batch"] = SimpleNamespace(run=run)
    flags["batch"] = resume_flags(run / "checkpoints" / "last", "--steps=8", "--batch_size=2")

    run = copy_run(half, root / "lr")
    cases["lr"] = SimpleNamespace(run=run)
    flags["lr"] = resume_flags(run / "checkpoints" / "last", "--steps=8", "--optimizer.lr=0.0005")

    # a trainer that saved mid-window: its record without loop state, saved with K=3 at step 4
    run = copy_run(half, root / "legacy")
    record = run / "checkpoints/000004/training_state/training_step.json"
    data = json.loads(record.read_text())
    data.pop("loop")
    data["grad_accum_steps"] = 3
    record.write_text(json.dumps(data))
    cases["legacy"] = SimpleNamespace(run=run)
    flags["legacy"] = resume_flags(run / "checkpoints" / "last", "--steps=8")

    # resume: a later save was killed mid-write (its staging tree is all that is left of it). No save in
    # this resume: a save's own cleanup would remove the leftover too, and hide a resume that did not
    run = copy_run(half, root / "leftover")
    shutil.copytree(run / "checkpoints" / "000004", run / "checkpoints" / ".tmp-000006-12345")
    cases["leftover"] = SimpleNamespace(run=run)
    flags["leftover"] = resume_flags(run / "checkpoints" / "last", "--steps=8", "--save_checkpoint=false")
    # fresh: the run's very first save was interrupted twice (only the staging tree exists)
    fresh = root / "leftover_fresh"
    (fresh / "checkpoints" / ".tmp-000002-999" / "pretrained_model").mkdir(parents=True)
    (fresh / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    cases["leftover_fresh"] = SimpleNamespace(run=fresh)
    flags["leftover_fresh"] = [*MLP, "--steps=2", f"--output_dir={fresh}"]

    for case, res in zip(flags, launch.lerobot_train_runs(*flags.values()), strict=True):
        cases[case].res = res
    return cases


def test_same_topology_continues_bitwise_in_place(runs, resumed):
    _, full, _ = runs
    run, res = resumed["same"].run, resumed["same"].res  # resumed with --output_dir=null (not given)
    assert warnings_of(res.stderr) == [] and "WARNING" not in res.stderr, res.stderr
    assert len(warnings_of(res.stderr, copied=True)) == 1  # a copy of `half`: said once, and it writes here
    assert "resuming at step 4" in res.stdout and f"→  {run}" in res.stdout
    assert "on gradient-accumulation window boundaries" in res.stdout  # the banner says where saves land
    assert losses(run) == losses(full)  # bitwise: the same floats, step by step
    step = json.loads((run / "checkpoints/last/training_state/training_step.json").read_text())
    assert step["loop"] == {
        "step": 8,
        "optimizer_steps": 4,
        "skipped_updates": 0,
        "grad_accum_steps": 2,
        "accumulated": 0,
    }


def test_moved_run_continues_where_it_is_now(runs, resumed):
    _, full, half = runs
    case = resumed["moved"]  # a copy of `half` renamed from `run` to `moved`, then resumed there
    run, moved, res = case.run, case.moved, case.res
    (warning,) = warnings_of(res.stderr, copied=True)
    assert f"continuing the run in {moved}" in warning and f"output_dir={half}" in warning
    assert not run.exists()  # the old location is not recreated
    assert losses(moved) == losses(full)
    saved = json.loads((moved / "checkpoints/last/pretrained_model/train_config.json").read_text())
    assert saved["output_dir"] == str(moved)  # the config says where the run really is


def test_copied_run_writes_into_the_copy_and_leaves_the_original_alone(runs, resumed):
    _, full, _ = runs
    case = resumed["copied"]  # `copy` of `original` resumed; `before`: the snapshot of `original` before it
    original, copy, before, res = case.original, case.copy, case.before, case.res
    assert f"continuing the run in {copy}" in res.stderr
    assert snapshot(original) == before
    assert (copy / "checkpoints" / "000008").is_dir() and losses(copy) == losses(full)


def test_another_batch_size_continues_the_stream_and_says_exactness_is_lost(resumed):
    run, res = resumed["batch"].run, resumed["batch"].res  # resumed with --batch_size=2
    (warning,) = warnings_of(res.stderr)
    assert "batch_size: 4 → 2" in warning and "per-rank sample-exactness is lost" in warning
    state = json.loads((run / "checkpoints/last/training_state/training_step.json").read_text())
    assert state["sampler"]["offset"] == 4 * 4 + 4 * 2  # the same stream, continued at sample 16


def test_optimizer_override_is_applied_and_recorded(runs, resumed):
    _, full, _ = runs
    run, res = resumed["lr"].run, resumed["lr"].res  # resumed with --optimizer.lr=0.0005
    (warning,) = warnings_of(res.stderr)
    assert (
        "changed optimizer/scheduler settings, applied from step 4 on: optimizer.lr: 0.001 → 0.0005"
        in warning
    )
    lrs = {r["step"]: r["lr"] for r in records(run)}
    assert [lrs[s] for s in (1, 2, 3, 4)] == [0.001] * 4 and [lrs[s] for s in (5, 6, 7, 8)] == [0.0005] * 4
    got, want = losses(run), losses(full)
    assert [got[s] for s in range(1, 7)] == [
        want[s] for s in range(1, 7)
    ]  # the first new update is at step 6
    assert got[7] != want[7]
    saved = json.loads((run / "checkpoints/last/pretrained_model/train_config.json").read_text())
    assert saved["optimizer"]["lr"] == 0.0005


def test_checkpoint_saved_inside_an_accumulation_window_says_what_it_lost(resumed):
    """Saves land on window boundaries now; a checkpoint from a trainer that saved mid-window (its
    record without loop state, saved with K=3 at step 4) still resumes, and the warning says which
    micro-batches' gradients are gone rather than claiming exactness. (The record is edited so in
    ``resumed``.)"""
    res = resumed["legacy"].res
    (warning,) = warnings_of(res.stderr)
    assert "grad_accum_steps: 3 → 2" in warning
    assert (
        "inside a 3-step gradient-accumulation window: the gradients of its last 1 micro-batch(es) (steps "
        "4-4) were not saved and are not applied"
    ) in warning


def test_older_checkpoint_is_refused_then_set_aside_on_request(launch, runs):
    root, full, _ = runs
    run = copy_run(full, root / "older")
    before = snapshot(run)
    res = resume(launch, run / "checkpoints" / "000004", "--steps=8", ok=False)
    assert res.returncode == 2 and "holds checkpoints newer than 000004 (000008)" in res.stderr
    assert snapshot(run) == before
    res = resume(launch, run / "checkpoints" / "000004", "--steps=8", "--abandon_newer_checkpoints=true")
    notes = warnings_of(res.stderr)
    assert len(notes) == 2 and "set aside the checkpoints newer than 000004 (000008)" in notes[0]
    assert "metrics.jsonl had 4 line(s) after step 4" in notes[1]
    (aside,) = (run / "abandoned").iterdir()
    assert (aside / "checkpoints" / "000008" / "training_state").is_dir()  # moved whole, not deleted
    assert (
        before["checkpoints/000008/pretrained_model/model.safetensors"]
        == (aside / "checkpoints/000008/pretrained_model/model.safetensors").read_bytes()
    )
    steps = [r["step"] for r in records(run)]
    assert steps == list(range(1, 9))  # no step twice
    assert losses(run) == losses(full)  # the redone steps are the same steps
    saved = json.loads((run / "checkpoints/last/pretrained_model/train_config.json").read_text())
    assert saved["abandon_newer_checkpoints"] is False  # a later resume decides again


def test_ddp_to_fsdp2_at_the_same_world_size_is_not_called_inexact(launch, tmp_path):
    args = [*MLP, "--save_freq=2"]
    full, half = tmp_path / "full", tmp_path / "half"
    # one launch: the two DDP runs, then the FSDP2 resume of the shorter one (its stderr is split off)
    *_, res = launch.lerobot_train_runs(
        [*args, "--steps=4", f"--output_dir={full}"],
        [*args, "--steps=2", f"--output_dir={half}"],
        [
            "--resume=true",
            f"--config_path={half / 'checkpoints' / 'last'}",
            "--steps=4",
            "--parallelism.dp_shard=2",
        ],
        nproc=2,
    )
    (warning,) = warnings_of(res.stderr)
    assert "dp_replicate: 2 → 1; dp_shard: 1 → 2" in warning and "sample-exactness" not in warning
    got, want = losses(half), losses(full)
    assert got == want  # bitwise: the same gradients, averaged over the same 2 ranks either way


def _start(launch, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [SCRIPT, *MLP, "--steps=1000000", "--save_freq=0", "--log_freq=1", f"--output_dir={out}", *extra]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=launch.clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_lines(out: Path, n: int, proc: subprocess.Popen, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError(f"no {n} metrics lines within {timeout_s} s")


def test_one_run_owns_its_directory_and_a_crashed_owner_is_taken_over(launch, tmp_path):
    out = tmp_path / "owned"
    first = _start(launch, out)
    try:
        _wait_lines(out, 2, first)
        res = lerobot_train(launch, *MLP, "--steps=2", f"--output_dir={out}", ok=False)
        assert res.returncode == 2, res.describe()
        (line,) = res.stderr.strip().splitlines()
        assert f"is in use by another run (pid {first.pid} on " in line and "wait for it to end" in line
        os.killpg(first.pid, signal.SIGKILL)  # a crash: no cleanup of any kind
        first.wait(30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    lines = len((out / "metrics.jsonl").read_text().splitlines())
    res = lerobot_train(launch, *MLP, "--steps=2", f"--output_dir={out}")
    notes = warnings_of(res.stderr)
    assert len(notes) == 2, res.stderr
    assert f"lock was left by pid {first.pid} on " in notes[0] and "killed or crashed" in notes[0]
    assert "held an earlier run that committed no checkpoint" in notes[1] and f"({lines} lines)" in notes[1]
    assert [r["step"] for r in records(out)] == [1, 2]  # the dead run's lines are set aside, not mixed in
    (aside,) = (out / "abandoned").iterdir()
    assert len((aside / "metrics.jsonl").read_text().splitlines()) == lines
    assert not (out / ".lerobot-run.lock").exists()  # released at the end


def test_interrupted_save_leftovers_are_recognised_and_cleaned(runs, resumed):
    _, full, _ = runs
    # resume: a later save was killed mid-write (its staging tree is all that is left of it)
    run, res = resumed["leftover"].run, resumed["leftover"].res
    (warning,) = warnings_of(res.stderr)
    assert "removed what an interrupted save left" in warning and ".tmp-000006-12345" in warning
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "000004",
        "last",
    ]  # removed, as it says
    assert losses(run) == losses(full)
    # fresh: the run's very first save was interrupted twice (only the staging tree exists)
    fresh, res = resumed["leftover_fresh"].run, resumed["leftover_fresh"].res
    notes = warnings_of(res.stderr)
    assert any(".tmp-000002-999" in n for n in notes) and any("committed no checkpoint" in n for n in notes)
    assert sorted(p.name for p in (fresh / "checkpoints").iterdir()) == ["000002", "last"]


@pytest.mark.parametrize(
    ("nproc", "degrees"),
    [(2, ["--parallelism.dp_shard=2"]), (4, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"])],
    ids=["fsdp2", "hsdp"],
)
def test_sharded_resume_through_lerobot_train_is_bitwise(launch, tmp_path, nproc, degrees):
    """FSDP2 and HSDP, saved as DCP shards and resumed by lerobot-train on the same topology, continue
    with the very floats of the uninterrupted run. The resume branches off step 2 into a new run
    directory, which also shows that the original run is left as it was. Both runs share a launch;
    the original is digested between them."""
    args = [*MLP, "--batch_size=2", "--save_freq=2", "--checkpoint_format=dcp", *degrees]
    full, branch = tmp_path / "full", tmp_path / "branch"
    # one launch: the run, a digest of its directory (every file's sha256), then the resume
    before = launch.TreeDigest(full, tmp_path / "full_before.json")
    _, res = launch.lerobot_train_runs(
        [*args, "--steps=4", f"--output_dir={full}"],
        before,
        resume_flags(full / "checkpoints" / "000002", "--steps=4", f"--output_dir={branch}"),
        nproc=nproc,
    )
    assert f"continuing {full / 'checkpoints' / '000002'} in the new run directory {branch}" in res.stderr
    assert before.read() and launch.tree_digest(full) == before.read()
    got, want = losses(branch), losses(full)
    assert sorted(got) == [3, 4] and all(got[s] == want[s] for s in got), (got, want)
    assert (branch / "checkpoints" / "000004" / "training_state" / "optimizer_0").is_dir()
