"""SIGINT/SIGTERM with DataLoader workers running: every rank stops at the same step, one checkpoint is
saved, and the resume continues exactly (its losses equal an uninterrupted run's, bitwise, step by step).

Each drill is one launch of ``lerobot-train`` (a tiny MLP, ``--num_workers=2``, 4-step accumulation
windows, a held-out split) that the drill signals once it is where the drill wants it:

* ``launcher``: SIGTERM to torchrun, which forwards it to each rank's process group (the rank and its
  workers), while an asynchronous save is in flight (held in its background phase by the ckpt test
  hook, so the signal lands inside it);
* ``group``: one process, SIGTERM to its process group (the process and its workers), as
  ``kill -TERM -<pgid>`` or systemd's stop (every process of the unit) sends it;
* ``everyone``: SIGTERM to every process of the job, as SLURM sends it on scancel or pre-emption: each
  rank's group (rank and workers) during the first held-out eval pass, as soon as its workers exist,
  then torchrun, which forwards its own copy: each rank gets it again, a second after the first
  (two copies that arrive before the rank's handler ran make one call), while the interrupt's save
  is still open (an asynchronous one, held by the ckpt test hook). That repeat is the same request,
  not a second signal: taken for one, it would kill the save;
* ``one_rank``: SIGINT to rank 1 alone. torchrun signals every rank at once, so the other drills pass
  even without the ranks' agreement; here rank 0 learns of the signal only through it.

(Ctrl-C in a terminal, SIGINT to a process group, did not kill a worker even before: a forked worker
inherits its rank's Python handler for SIGINT, which only sets a flag; packages/lerobot-trainloop/tests/
test_trainloop_worker_signals.py checks that shielded workers ignore it.)

Without the workers' shield (lerobot_trainloop.worker_signals) the first three fail within seconds with
"DataLoader worker ... killed by signal" and no checkpoint. The interrupted runs' resumes and an
uninterrupted reference run of each world size then share one launch per world size.
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
from collections.abc import Callable
from pathlib import Path

import pytest
from attrs import define

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
ARGS = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=2",
    "--policy.type=mlp",
    "--policy.hidden_dim=32",
    "--batch_size=4",
    "--log_freq=1",
    "--dataset.eval_split=0.2",
    "--accelerator.gradient_accumulation.steps=4",
]
NO_EVAL = "--eval_steps=1000000"  # the held-out split is every run's (the same training set), its eval is not
WINDOW = 4
STARTUP_S = 180
SAVE_FREQ, COMMIT_DELAY_S = 8, 1.0  # the launcher drill's async saves: each in flight for over a second
EVAL_STEPS = 8
# the everyone drill: torchrun's copy comes this long after the ranks' own (lerobot_cli.interrupt.REPEAT_S
# is 2 s), while the interrupt's save, held this long, is still open
REPEAT_AFTER_S, SAVE_HELD_S = 1.0, 2.0
# A drill's job ends within seconds of its signal; one still running this long after it is hung (torchrun
# gives its ranks 30 s after its own signal): its processes print their stacks (DrillJob.dump_stacks)
HUNG_AFTER_S = 25

pytestmark = pytest.mark.slow


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"lerobot_tests_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


drill_job = _load("drill_job")
metrics_lines = drill_job.metrics_lines


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (a rank's DataLoader workers)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(name))
    return found


def _poll(predicate: Callable[[], object], job, timeout_s: float, what: str, every_s: float = 0.005):
    """``predicate()`` once it is truthy (polled fast: the drills aim at short moments)."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert job.proc.poll() is None, f"job ended (rc={job.proc.returncode}) before {what}:\n{job.output()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f} s:\n{job.output()}"
        time.sleep(every_s)
    return value


def _staging(ckpts: Path) -> list[str]:
    try:
        return sorted(p.name for p in ckpts.iterdir() if re.fullmatch(r"\.tmp-\d+-\d+", p.name))
    except FileNotFoundError:
        return []


def signal_launcher_during_async_save(job, out: Path) -> dict:
    job.wait_for(lambda: metrics_lines(out) >= 1, STARTUP_S, "a first step")
    staging = _poll(lambda: _staging(out / "checkpoints"), job, 60, "a save in flight")
    os.kill(job.proc.pid, signal.SIGTERM)
    return {"in_flight": int(staging[0].split("-")[1])}


def signal_process_group(job, out: Path) -> dict:
    job.wait_for(lambda: metrics_lines(out) >= 5, STARTUP_S, "five steps")
    os.killpg(job.proc.pid, signal.SIGTERM)  # DrillJob starts it as a session (and group) leader
    return {}


def signal_every_process_during_eval(job, out: Path) -> dict:
    job.wait_for(lambda: metrics_lines(out) >= 1, STARTUP_S, "a first step")
    ranks = job.find_workers(2)
    _poll(lambda: len(_children(ranks[0])) > 2, job, 60, "the eval loader's workers")  # 2 train + 2 eval
    in_eval = "eval step" not in job.stdout_path.read_text()  # the first pass has not reported yet
    for pid in ranks.values():
        os.killpg(pid, signal.SIGTERM)  # torchrun starts each rank as a group leader (its workers inside)
    time.sleep(REPEAT_AFTER_S)
    os.killpg(job.proc.pid, signal.SIGTERM)
    return {"in_eval": in_eval}


def signal_one_rank(job, out: Path) -> dict:
    job.wait_for(lambda: metrics_lines(out) >= 5, STARTUP_S, "five steps")
    os.kill(job.find_workers(2)[1], signal.SIGINT)  # the rank only: not its workers, not rank 0
    return {}


@define(frozen=True)
class Drill:
    nproc: int
    sig: signal.Signals
    fire: Callable  # (job, out) -> facts: waits for the drill's moment, then signals
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


DRILLS = {
    "launcher": Drill(
        2,
        signal.SIGTERM,
        signal_launcher_during_async_save,
        ("--checkpoint_async=true", f"--save_freq={SAVE_FREQ}", NO_EVAL),
        (("LEROBOT_CKPT_TEST_COMMIT_DELAY_S", str(COMMIT_DELAY_S)),),
    ),
    "group": Drill(1, signal.SIGTERM, signal_process_group, ("--save_freq=0", NO_EVAL)),
    "everyone": Drill(
        2,
        signal.SIGTERM,
        signal_every_process_during_eval,
        ("--save_freq=0", f"--eval_steps={EVAL_STEPS}", "--checkpoint_async=true"),
        (("LEROBOT_CKPT_TEST_COMMIT_DELAY_S", str(SAVE_HELD_S)),),
    ),
    "one_rank": Drill(2, signal.SIGINT, signal_one_rank, ("--save_freq=0", NO_EVAL)),
}


def _no_process_left(job, timeout_s: float = 5.0) -> list[int]:
    """Pids of the job still alive ``timeout_s`` after it ended: its ranks and their workers (the
    workers inherit the rank's environment, which ``alive_workers`` matches), or its process group."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = job.alive_workers()
        try:
            os.killpg(job.proc.pid, 0)
            left.append(job.proc.pid)
        except ProcessLookupError:
            pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _run_drill(launch, root: Path, name: str, drill: Drill) -> dict:
    out = root / name / "run"
    out.parent.mkdir(parents=True)
    port = launch.free_port()
    cmd = (
        [SCRIPT]
        if drill.nproc == 1
        else [
            launch.PYTHON,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={drill.nproc}",
            f"--master-port={port}",
            "--monitor-interval=0.2",
            SCRIPT,
        ]
    )
    cmd += [*ARGS, *drill.flags, "--steps=100000", f"--output_dir={out}"]
    job = drill_job.DrillJob(cmd, out.parent, launch.clean_env(dict(drill.env)), port, launch)
    try:
        facts = drill.fire(job, out)
        ended = job.wait_end(90, dump_after_s=HUNG_AFTER_S)
        facts |= {
            "ended_s": None if ended is None else round(ended, 1),
            "rc": job.proc.returncode,
            "left": _no_process_left(job),
        }
        facts |= {"stdout": job.stdout_path.read_text(), "output": job.output()}
    finally:
        job.close()
    ckpts = out / "checkpoints"
    stops = re.findall(rf"interrupted by {drill.sig.name} at step (\d+)", facts["stdout"])
    state = ckpts / "last" / "training_state" / "training_step.json"
    facts |= {
        "out": out,
        "stops": [int(s) for s in stops],
        "last": json.loads(state.read_text())["step"] if state.is_file() else None,
        "committed": sorted(int(p.name) for p in ckpts.glob("[0-9]*") if p.is_dir()),
        "staging_left": _staging(ckpts),
    }
    return facts


def losses(out: Path) -> dict[int, float]:
    rows = (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def drills(launch, tmp_path_factory, request):
    """The selected drills' facts (``-k one_rank`` launches that drill alone); then, per world size, one
    launch with the resumes of those that left a checkpoint (4 steps each) and an uninterrupted
    reference run as long as the longest of them."""
    root = tmp_path_factory.mktemp("interrupt")
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    facts = {name: _run_drill(launch, root, name, DRILLS[name]) for name in DRILLS if name in selected}
    for nproc in sorted({d.nproc for d in DRILLS.values()}):
        names = [n for n in facts if DRILLS[n].nproc == nproc and facts[n]["last"] is not None]
        if not names:
            continue
        ref = root / f"reference-{nproc}"
        runs = [
            [
                "--resume=true",
                f"--config_path={facts[n]['out'] / 'checkpoints' / 'last'}",
                f"--steps={facts[n]['last'] + WINDOW}",
            ]
            for n in names
        ]
        longest = max(facts[n]["last"] for n in names) + WINDOW
        runs.append([*ARGS, NO_EVAL, f"--steps={longest}", "--save_checkpoint=false", f"--output_dir={ref}"])
        outputs = launch.lerobot_train_runs(*runs, nproc=nproc)
        for name, res in zip(names, outputs[:-1], strict=True):
            facts[name] |= {"resumed": res, "reference": losses(ref)}
    return facts


@pytest.mark.parametrize("name", list(DRILLS))
def test_a_signal_stops_every_rank_at_one_step_with_one_checkpoint_and_resume_continues_exactly(drills, name):
    drill, f = DRILLS[name], drills[name]
    summary = {k: v for k, v in f.items() if k not in ("stdout", "output", "resumed", "reference")}
    print(f"\n[interrupt drill {name}] {summary}")
    output = f["output"]
    hung = output.find("[drill] still running")  # a hung job's stacks follow: show them whole
    output = output[-6000:] if hung < 0 else output[max(0, hung - 3000) :]
    assert f["ended_s"] is not None, f"still running 90 s after the signal:\n{output}"
    assert "DataLoader worker" not in f["output"], output  # no worker was killed by the signal
    assert not re.search(r"\[rank \d+/\d+\] failed with", f["output"]), output  # no rank failed
    assert f["rc"] == (128 + drill.sig if drill.nproc == 1 else 1), output  # torchrun: its own code
    # one common stop, said once (by the main rank), at the end of an accumulation window
    assert len(f["stops"]) == 1, output
    step = f["stops"][0]
    assert step % WINDOW == 0 and f["last"] == step, output
    # its checkpoint is the only one (the launcher drill also commits the save that was in flight)
    assert f["committed"] == sorted({step, f.get("in_flight", step)}) and f["staging_left"] == [], output
    assert f["left"] == [], f"processes of the job outlived it: {f['left']}"
    if name == "launcher":
        assert f["in_flight"] < step
    if name == "everyone":
        assert f["in_eval"], "the signal came after the first eval pass had ended"
        assert step <= EVAL_STEPS + 2 * WINDOW, output  # stopped soon after that pass
    # the resume continues exactly: every step's loss, before and after the interrupt, is the reference's
    resumed = f["resumed"]
    assert f"resuming at step {step}" in resumed.stdout, resumed.stdout
    got = losses(f["out"])
    assert sorted(got) == list(range(1, step + WINDOW + 1))
    assert got == {s: f["reference"][s] for s in got}
