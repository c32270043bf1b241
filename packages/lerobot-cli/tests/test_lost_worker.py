"""The line lerobot-train ends with when a DataLoader worker dies: the worker, its signal, the likely cause
by signal, the checkpoint to resume from or that there is none yet, and the rank when several train. (The
real run, a worker SIGKILLed under lerobot-train: tests/test_worker_failures.py.)"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from lerobot_cli.lost_worker import worker_death_line
from lerobot_trainloop.worker_failures import DataLoaderWorkerDied


def test_sigkill_names_host_memory_what_num_workers_costs_and_the_checkpoint():
    died = DataLoaderWorkerDied(2, 4242, -signal.SIGKILL, others_private_bytes=3 * 2**29)
    line = worker_death_line(died, 4, Path("/runs/a/checkpoints/000200"))
    assert line.startswith("DataLoader worker 2 (pid 4242) was killed by SIGKILL (most likely the kernel's ")
    assert "each of the --num_workers=4 workers is a process of its own" in line
    assert "a live one holds 1.5 GiB of its own" in line and "lower --num_workers" in line
    assert line.endswith(
        "; last checkpoint: /runs/a/checkpoints/000200 (continue with --resume=true "
        "--config_path=/runs/a/checkpoints/000200)"
    )
    assert "\n" not in line


def test_before_any_checkpoint_and_on_a_rank_of_several():
    died = DataLoaderWorkerDied(0, 7, -signal.SIGKILL)
    line = worker_death_line(died, 1, None, rank=3)
    assert line.startswith("rank 3: DataLoader worker 0 (pid 7) was killed by SIGKILL")
    assert line.endswith("; no checkpoint yet") and "a live one holds" not in line


@pytest.mark.parametrize(
    ("exitcode", "cause"),
    [
        (-signal.SIGBUS, "most likely a full /dev/shm"),
        (-signal.SIGSEGV, "a crash in native code it ran"),
        (-signal.SIGUSR1, "another process sent it that signal"),
        (1, "its own error is above, if it printed one"),
    ],
)
def test_each_ending_gets_its_likely_cause(exitcode, cause):
    line = worker_death_line(DataLoaderWorkerDied(0, 7, exitcode), 2, None)
    assert cause in line, line
