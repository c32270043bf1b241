"""A ``torchrun … lerobot-train`` job the reliability drills can watch and hurt while it runs.

``launch.torchrun`` waits for the job to end; a drill must act *during* training (kill or stop one
rank once it is provably inside the step loop) and time how long the job takes to end after that.
Output goes to files, not pipes, so a job nobody reads cannot block on a full pipe. torchrun starts each
worker in a session of its own, so killing the launcher's session is not enough: a worker outlives a SIGKILLed
agent and trains on, orphaned (seen while writing these drills). Workers are therefore found by their
environment (``RANK``, and this job's unique ``MASTER_PORT``) and killed by pid at the end.

A job that hangs where it should have ended shows where: it runs with ``PYTHONFAULTHANDLER=1``, and
``wait_end(..., dump_after_s=…)`` sends SIGABRT to every process of the job still running by then (its
ranks and their DataLoader workers, which inherit the handler through the fork), so each prints every
thread's Python stack to the job's stderr before it dies. A drill's hang that only shows up under load
(once, in CI) is otherwise a bare "it did not stop".
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "data" / "lerobot" / "demo_reach"
# the small, fast lerobot-train job the drills interrupt, kill and resume
MLP = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=mlp",
    "--policy.hidden_dim=32",
    "--batch_size=4",
]


def metrics_lines(out: Path) -> int:
    """Loop steps logged so far by the job writing ``out`` (its metrics.jsonl lines)."""
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields after ``(comm)``: state, ppid, …; None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _state(pid: int) -> str | None:
    """A process's state letter (``Z``: dead, not yet reaped), None when it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else None


def _parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


class DrillJob:
    def __init__(self, cmd: list[str], workdir: Path, env: dict[str, str], master_port: int, launch) -> None:
        self._launch = launch  # tests/launch.py (the ``launch`` fixture): finds this job's ranks in /proc
        self.master_port = str(master_port)
        self.stdout_path, self.stderr_path = workdir / "job.stdout", workdir / "job.stderr"
        self._out, self._err = self.stdout_path.open("w"), self.stderr_path.open("w")
        env = {**env, "PYTHONFAULTHANDLER": "1"}  # SIGABRT prints the stacks (dump_stacks)
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._out, stderr=self._err, start_new_session=True)
        self.workers: dict[int, int] = {}

    def find_workers(self, nproc: int) -> dict[int, int]:
        """``{rank: pid}`` of torchrun's workers: children of the launcher (the agent) with ``RANK`` set."""
        found: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and _parent_of(int(name)) == self.proc.pid:
                env = self._launch.process_environ(int(name))
                if "RANK" in env and "TORCHELASTIC_RUN_ID" in env:
                    found.setdefault(int(env["RANK"]), []).append(int(name))
        assert sorted(found) == list(range(nproc)) and all(len(p) == 1 for p in found.values()), found
        self.workers = {rank: pids[0] for rank, pids in found.items()}
        return self.workers

    def wait_for(self, predicate, timeout_s: float, what: str, allow_end: bool = False) -> None:
        """Poll ``predicate`` (5 Hz); ``allow_end``: the job may end meanwhile,
        if the predicate then holds."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.proc.poll() is not None:
                assert allow_end and predicate(), (
                    f"job ended (rc={self.proc.returncode}) before {what}:\n{self.output()}"
                )
                return
            assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f} s:\n{self.output()}"
            time.sleep(0.2)

    def wait_end(self, timeout_s: float, dump_after_s: float | None = None) -> float | None:
        """Seconds until the launcher exited, or None when it was still running after ``timeout_s``.
        ``dump_after_s``: a job still running by then is hung (a healthy one has long ended): its
        processes print their stacks and die (:meth:`dump_stacks`), and the wait goes on."""
        t0 = time.monotonic()
        try:
            self.proc.wait(timeout=timeout_s if dump_after_s is None else min(dump_after_s, timeout_s))
        except subprocess.TimeoutExpired:
            if dump_after_s is None or dump_after_s >= timeout_s:
                return None
            self.dump_stacks()
            try:
                self.proc.wait(timeout=timeout_s - dump_after_s)
            except subprocess.TimeoutExpired:
                return None
        return time.monotonic() - t0

    def dump_stacks(self) -> list[int]:
        """SIGABRT to every process of the job (ranks and workers, found by their environment): with
        the faulthandler on, each writes all its threads' stacks to stderr, then dies. Returns the pids."""
        pids = sorted(self._running())
        self._err.write(f"\n[drill] still running: SIGABRT to {pids} for their stacks\n")
        self._err.flush()  # the file description the job writes to: one offset, nothing overwritten
        for pid in pids:  # one at a time: dumps written at once interleave line by line
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 2.0
            while _state(pid) not in (None, "Z") and time.monotonic() < deadline:
                time.sleep(0.05)
        return pids

    def output(self) -> str:
        self._out.flush()
        self._err.flush()
        return self.stdout_path.read_text() + self.stderr_path.read_text()

    def alive_workers(self) -> list[int]:
        """Ranks of this job still running, wherever they were reparented (zombies have no environ)."""
        return sorted(self._running().values())

    def _running(self) -> dict[int, int]:
        """``{pid: rank}`` of every process whose environment says it is a rank of this job."""
        return self._launch.job_ranks(self.master_port)

    def close(self) -> None:
        """Kill whatever is left of the job (a stopped rank too: SIGKILL needs no SIGCONT)."""
        for pid in self._running():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._out.close()
        self._err.close()
