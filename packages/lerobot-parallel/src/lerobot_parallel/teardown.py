"""Clean process-group shutdown on every exit path.

Two failure modes motivate this module:

* A process that leaves without ``destroy_process_group()`` (or right after it) can die with
  SIGABRT during interpreter finalisation: gloo worker threads still hold work objects whose
  destruction needs the GIL (pytorch#190489). A successful run then *looks* failed. Destroying
  the group and sleeping briefly so those threads drain was measured to avoid it.
* A rank that raises must end the whole job quickly and say which rank failed. The launcher
  (torchrun's agent) kills the surviving ranks when one exits non-zero, so the failing rank
  must exit rather than hang in teardown: no barrier here, ever, and ``destroy`` on gloo and
  nccl is local.

A third one: a rank whose launcher was killed (``kill -9`` of torchrun, which starts every worker
in a session of its own) would train on, orphaned. The session arms a :class:`LauncherWatch`
for ranks a launcher started and stops it first thing in teardown, so it cannot fire during a
clean exit.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from lerobot_parallel.config import AcceleratorConfig, ParallelismConfig
from lerobot_parallel.errors import ParallelismError
from lerobot_parallel.launch_env import LaunchEnv
from lerobot_parallel.runtime import ParallelRuntime, init_runtime
from lerobot_parallel.watchdog import LauncherWatch, launcher_watch_wanted, start_launcher_watch

DEFAULT_SETTLE_S = 0.5


def shutdown_process_group(
    runtime: ParallelRuntime | None = None, settle_s: float = DEFAULT_SETTLE_S
) -> bool:
    """Destroy the default process group if we own it, then let backend threads settle.

    Returns whether a group was destroyed. A group adopted from a foreign trainer
    (``runtime.owns_process_group`` False) is left alone.
    """
    if runtime is not None and not runtime.owns_process_group:
        return False
    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.destroy_process_group()
    if settle_s > 0:
        time.sleep(settle_s)
    return True


def report_rank_failure(rank: int, world_size: int, exc: BaseException, stream=None) -> None:
    """Print the failing rank and its error to stderr, where torchrun's summary does not reach."""
    stream = stream or sys.stderr
    body = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    stream.write(f"[rank {rank}/{world_size}] failed with {type(exc).__name__}: {exc}\n{body}")
    stream.flush()


@contextmanager
def parallel_session(
    parallelism: ParallelismConfig | None = None,
    accelerator: AcceleratorConfig | None = None,
    *,
    device: str | torch.device | None = None,
    launch: LaunchEnv | None = None,
    settle_s: float = DEFAULT_SETTLE_S,
    watch_launcher: bool | None = None,
) -> Iterator[ParallelRuntime]:
    """``with parallel_session(...) as rt:`` — init, yield the runtime, always tear down.

    On an exception the rank and error are printed before re-raising, so the job log names
    the rank even when the launcher's own summary is terse; ``KeyboardInterrupt`` and
    ``SystemExit`` are passed through quietly.

    ``watch_launcher``: exit hard when the parent process (the launcher) is gone. ``None`` arms it
    when a launcher started this process (``launcher_watch_wanted``) and the process group is not
    a foreign trainer's; ``True``/``False`` force it on/off. Armed before the rendezvous, which
    would otherwise wait for a store the dead launcher hosted.
    """
    launch = launch or LaunchEnv.from_environ()
    runtime = None
    foreign_group = dist.is_available() and dist.is_initialized()
    if watch_launcher is None:
        watch_launcher = not foreign_group and launcher_watch_wanted(launch)
    watch: LauncherWatch | None = start_launcher_watch(launch) if watch_launcher else None
    try:
        runtime = init_runtime(parallelism, accelerator, device=device, launch=launch)
        yield runtime
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        if watch is not None and watch.parent_is_gone():
            watch.exit_now()  # a peer saw the launcher gone first and its exit broke our collective
        # A topology or device refused before the runtime exists is a usage error, the same on every
        # rank: the caller prints it once; a failure report with a traceback would bury it.
        if launch.world_size > 1 and not (runtime is None and isinstance(exc, ParallelismError)):
            report_rank_failure(launch.rank, launch.world_size, exc)
        raise
    finally:
        if watch is not None:
            watch.stop()
        if runtime is not None:
            shutdown_process_group(runtime, settle_s)
        elif not foreign_group:
            # init_runtime failed after creating the group (e.g. in mesh construction)
            shutdown_process_group(None, settle_s)
