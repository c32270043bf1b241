"""Launch real multi-process jobs from tests, with a hard timeout and a watchdog.

Every launch runs in its own session (process group) so a timeout kills the launcher; torchrun
starts its workers in sessions of their own, so they are found by their ``MASTER_PORT`` and killed
too (before the output pipes they hold are drained). A test can never leave orphaned ranks holding
a port or a core, nor hang on them. The scripts
launched also arm ``faulthandler`` (see ``multiproc/_common.py``) so a hung rank dumps its
stack before the outer timeout fires.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from attrs import define

REPO = Path(__file__).resolve().parents[1]
MULTIPROC = Path(__file__).resolve().parent / "multiproc"
PYTHON = sys.executable
LEROBOT_TRAIN = str(Path(PYTHON).parent / "lerobot-train")  # the workspace's console script
TRAIN_MANY = MULTIPROC / "train_many.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@define(frozen=True)
class Launched:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    timed_out: bool
    ended_at: float  # time.time() when the launcher had exited

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def describe(self) -> str:
        return (
            f"rc={self.returncode} timed_out={self.timed_out} in {self.elapsed_s:.1f}s\n"
            f"--- stdout ---\n{self.stdout[-6000:]}\n--- stderr ---\n{self.stderr[-6000:]}"
        )


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test process's environment minus anything that would configure the launched job."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_", "LEROBOT_ALLOW"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def process_environ(pid: int) -> dict[str, str]:
    """A process's environment from /proc ({} when it is gone or not ours)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def job_ranks(master_port: int | str) -> dict[int, int]:
    """``{pid: rank}`` of the torchrun workers of the job using ``master_port``, wherever they were
    reparented: torchrun starts each worker in a session of its own, so a process group misses them."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            env = process_environ(int(name))
            if env.get("MASTER_PORT") == str(master_port) and "RANK" in env and "TORCHELASTIC_RUN_ID" in env:
                out[int(name)] = int(env["RANK"])
    return out


def _kill_ranks(master_port: int) -> None:
    for pid in job_ranks(master_port):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_command(
    cmd: list[str],
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    master_port: int | None = None,
) -> Launched:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=clean_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        if master_port is not None:  # before reading on: the ranks hold the output pipes open
            _kill_ranks(master_port)
        out, err = proc.communicate()
    finally:
        try:  # workers that outlived a crashed launcher
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if master_port is not None:
            _kill_ranks(master_port)
    return Launched(proc.returncode, out, err, time.monotonic() - t0, timed_out, time.time())


def torchrun(
    script: Path | str, *args: str, nproc: int = 2, timeout_s: float = 90, env: dict[str, str] | None = None
) -> Launched:
    """``python -m torch.distributed.run --nproc-per-node=N --master-port=<free> script args``."""
    port = free_port()
    cmd = [
        PYTHON,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--master-port={port}",
        "--monitor-interval=0.2",
        str(script),
        *args,
    ]
    return run_command(cmd, timeout_s=timeout_s, env=env, master_port=port)


def accelerate_launch(
    script: Path | str,
    *args: str,
    launch_args: tuple[str, ...] = (),
    timeout_s: float = 90,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
) -> Launched:
    """``accelerate launch <launch_args> script``: the workspace's own ``accelerate`` console script."""
    cmd = [str(Path(PYTHON).parent / "accelerate"), "launch", *launch_args, str(script), *args]
    return run_command(cmd, timeout_s=timeout_s, env=env, cwd=cwd)


def lerobot_train(
    *args: str, nproc: int = 1, timeout_s: float | None = None, env: dict[str, str] | None = None
) -> Launched:
    """One ``lerobot-train <args>`` run that must succeed: on one process (``nproc=1``, default
    timeout 240 s) or under ``torchrun --nproc-per-node=nproc`` (default 300 s). Asserts it neither
    timed out nor exited non-zero (the message is the run's output) and returns the ``Launched``."""
    if nproc == 1:
        res = run_command([LEROBOT_TRAIN, *args], timeout_s=timeout_s or 240, env=env)
    else:
        res = torchrun(LEROBOT_TRAIN, *args, nproc=nproc, timeout_s=timeout_s or 300, env=env)
    assert not res.timed_out and res.returncode == 0, res.describe()
    return res


@define(frozen=True)
class RunOutput:
    """What one run of ``lerobot_train_runs`` printed (rank 0's share of the launch's output)."""

    stdout: str
    stderr: str


RUN_MARKER = "=== train_many run "  # multiproc/train_many.py prints it (rank 0) before each run


def _split_runs(text: str, n: int, res: Launched) -> list[str]:
    parts = text.split(RUN_MARKER)[1:]
    assert [p.split(" ===", 1)[0] for p in parts] == [str(i) for i in range(n)], res.describe()
    return [p.split(" ===\n", 1)[1] if " ===\n" in p else "" for p in parts]


def tree_digest(root: Path | str) -> dict[str, str]:
    """Every entry under ``root``: a file's sha256, a link's ``-> target``, ``dir`` for a directory."""
    root = Path(root)
    return {
        str(p.relative_to(root)): (
            f"-> {os.readlink(p)}"
            if p.is_symlink()
            else "dir"
            if p.is_dir()
            else hashlib.sha256(p.read_bytes()).hexdigest()
        )
        for p in sorted(root.rglob("*"))
    }


@define(frozen=True)
class TreeDigest:
    """Not a run: an item of ``lerobot_train_runs`` at which rank 0 writes ``tree_digest(root)`` as JSON to
    ``path`` (after the runs before it returned on rank 0, before the next one starts anywhere: that
    one's process group needs rank 0). What a test compares the tree with after the later runs."""

    root: Path
    path: Path

    def args(self) -> list[str]:
        return [TREE_DIGEST, str(self.root), str(self.path)]

    def read(self) -> dict[str, str]:
        return json.loads(Path(self.path).read_text())


TREE_DIGEST = "@tree_digest"  # train_many.py's word for a TreeDigest item


def lerobot_train_runs(
    *runs: Sequence[str] | TreeDigest,
    nproc: int = 1,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> list[RunOutput]:
    """Several ``lerobot-train`` runs (each a sequence of flags) one after another in ONE launch
    (``multiproc/train_many.py``: ``lerobot_cli.train.main`` per run, in the same processes), so the
    start-up is paid once. A ``TreeDigest`` item records a directory between two runs. Every run must
    succeed (asserted as in ``lerobot_train``); returns each run's stdout and stderr, split at the marker rank
    0 prints before each run (another rank's stderr lands in the run it was printed during; torchrun's own log
    lines too)."""
    args: list[str] = []
    for flags in runs:
        args += [*(flags.args() if isinstance(flags, TreeDigest) else flags), "--then"]
    runs = tuple(r for r in runs if not isinstance(r, TreeDigest))
    budget = timeout_s or (240 if nproc == 1 else 300) + 60 * (len(runs) - 1)
    if nproc == 1:
        res = run_command([PYTHON, str(TRAIN_MANY), *args], timeout_s=budget, env=env)
    else:
        res = torchrun(TRAIN_MANY, *args, nproc=nproc, timeout_s=budget, env=env)
    assert not res.timed_out and res.returncode == 0, res.describe()
    stdouts, stderrs = _split_runs(res.stdout, len(runs), res), _split_runs(res.stderr, len(runs), res)
    return [RunOutput(out, err) for out, err in zip(stdouts, stderrs, strict=True)]
