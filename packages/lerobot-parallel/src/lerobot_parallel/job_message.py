"""One line per job for an error every rank raises alike.

A user mistake found after the process group exists (a batch larger than the dataset, missing
dataset statistics, a damaged checkpoint) is found by every rank at about the same moment; if each
prints it, one sentence becomes one per rank. Only the main rank prints. The others must not exit
before it has: the launcher kills the remaining ranks as soon as one ends non-zero, which could
take the main rank down before its line is out. So a non-main rank waits (bounded) on the job's
store until the main rank says it has printed, and then leaves silently. When that never comes
(the main rank did not hit the error: this rank failed alone, or the store is gone), the rank
prints its own line after the wait, so an error is never lost, at worst repeated.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from typing import TextIO

import torch.distributed as dist

from lerobot_parallel.runtime import ParallelRuntime

PRINTED_KEY = "lerobot_parallel/job_message_printed"
DEFAULT_WAIT_S = 10.0  # ranks reach the same check within about a second; a lone failure waits this long


def _store():
    """The default process group's store, or None (no group, or a torch without this accessor)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - a private accessor: without it every rank prints
        return None


def _write(stream: TextIO, text: str) -> None:
    stream.write(text if text.endswith("\n") else text + "\n")
    stream.flush()


def print_once_per_job(
    text: str,
    runtime: ParallelRuntime | None,
    *,
    stream: TextIO | None = None,
    wait_s: float = DEFAULT_WAIT_S,
) -> None:
    """Print ``text`` on the main rank only, for an error all ranks raise; see the module docstring.

    ``runtime`` None (no session yet) or a single process prints directly.
    """
    stream = stream or sys.stderr
    store = _store() if runtime is not None and runtime.is_distributed else None
    if store is None or runtime.is_main:
        _write(stream, text)
        if store is not None:
            with contextlib.suppress(
                Exception
            ):  # a lost store: the peers print their own line after the wait
                store.set(PRINTED_KEY, "1")
        return
    try:
        store.wait([PRINTED_KEY], datetime.timedelta(seconds=max(0.1, min(wait_s, runtime.timeout_s))))
    except Exception:  # noqa: BLE001 - timeout or a lost store: the main rank did not report it
        _write(stream, text)
