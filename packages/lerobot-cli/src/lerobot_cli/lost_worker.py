"""The one line ``lerobot-train`` ends with when a DataLoader worker process dies under it.

torch's report is a ``RuntimeError`` traceback raised wherever the training process was (often inside the
backward pass) that names a pid and nothing else; what the user needs is which worker, what ended it, the
likely cause and where to resume from. The usual cause is the kernel's out-of-memory killer (SIGKILL):
every ``--num_workers`` worker is a process of its own, forked from the training process, that holds its
own copy of the dataset's state (Python's reference counting soon copies the shared pages it reads) and
its prefetched batches, so host memory grows with each worker. It is a failure of the run, not of its
input: exit code 1, as a failed checkpoint write (not 2, the usage errors' code).
"""

from __future__ import annotations

import signal
from pathlib import Path

from lerobot_trainloop.worker_failures import DataLoaderWorkerDied

_CRASHES = {signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


class WorkerLostError(Exception):
    """A DataLoader worker died: one line naming it, its signal, the likely cause and the last checkpoint."""


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**29 else f"{n / 2**20:.0f} MiB"


def _cause(died: DataLoaderWorkerDied, num_workers: int) -> str:
    flag = f"--num_workers={num_workers}"
    if died.signum == signal.SIGKILL:
        measured = (
            f"; a live one holds {_gib(died.others_private_bytes)} of its own"
            if died.others_private_bytes
            else ""
        )
        return (
            "most likely the kernel's out-of-memory killer, host memory having run out: each of the "
            f"{flag} workers is a process of its own that holds its own copy of the dataset's state and its "
            f"prefetched batches{measured}; lower --num_workers (0 loads in the training process) or free "
            "host memory"
        )
    if died.signum == signal.SIGBUS:
        return (
            "most likely a full /dev/shm, through which workers hand over their batches (a container's "
            "default is 64 MB): give it more shared memory (docker --shm-size), or lower --num_workers or "
            "--batch_size"
        )
    if died.signum in _CRASHES:
        return (
            "a crash in native code it ran (a video decoder, an image library or another extension); "
            "--num_workers=0 runs the same loading in the training process, where its error is shown"
        )
    if died.signum is not None:
        return "another process sent it that signal"
    return "its own error is above, if it printed one; --num_workers=0 shows it in the training process"


def worker_death_line(
    died: DataLoaderWorkerDied, num_workers: int, last_checkpoint: Path | None, rank: int | None = None
) -> str:
    """``died`` as the run's last line: what ended which worker, why, and what to resume from
    (``last_checkpoint``; None: no checkpoint yet). ``rank``: named when several processes train."""
    where = f"rank {rank}: " if rank is not None else ""
    if last_checkpoint is None:
        resume = "no checkpoint yet"
    else:
        resume = (
            f"last checkpoint: {last_checkpoint} (continue with --resume=true "
            f"--config_path={last_checkpoint})"
        )
    return f"{where}{died} ({_cause(died, num_workers)}); {resume}"
