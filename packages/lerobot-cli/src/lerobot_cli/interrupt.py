"""Stop cleanly on SIGINT/SIGTERM: every rank agrees on the same step, saves, then exits.

A launcher forwards the signal to each worker at slightly different moments, and a checkpoint is a
collective: a rank that stopped alone would leave the others blocked in the next all-reduce. So a
signal only sets a flag, and the ranks agree on it before anyone stops: they stop together at the
first step where the agreed flag is set or, inside a gradient-accumulation window, at the end of that
window (so the checkpoint they save resumes exactly). A second signal falls back to the default
behaviour (KeyboardInterrupt / termination) for users who really want out now, except a repeat of
the same signal within ``REPEAT_S`` of the first: that is one stop request delivered twice, as when a
scheduler (SLURM) signals every process of the job and torchrun forwards its own copy to the ranks;
taking it for insistence would kill the interrupt save. The handlers stay installed through that save
(the caller saves inside the ``with`` block), so a late repeat cannot kill it either.

Agreeing costs no blocking collective and no device sync per step: the flag is all-reduced (MAX) on a
gloo group of its own, over a host-memory tensor, *asynchronously*: the all-reduce started at loop
step n carries each rank's flag as it was then and is waited for at step n + 1, a whole step later
(by then it has long finished, so the wait does not block in practice; every rank waits at the same
step, so they all see the same value). Latency: with several processes, a signal that arrives during
step n stops the run after step n + 1 (or at the end of the accumulation window holding it), one step
later than a blocking check would; in one process it stops after step n (or its window's end). The
group of its own keeps this traffic off the training group's stream (nccl, or the gloo group that DDP
and checkpoints use), so it can never interleave differently with their collectives on two ranks.
"""

from __future__ import annotations

import datetime
import signal
import threading
import time
from typing import Self

import numpy as np
import torch
import torch.distributed as dist

WATCHED = (signal.SIGINT, signal.SIGTERM)
REPEAT_S = 2.0  # the same signal again within this many seconds is the same request, delivered twice


class TrainingInterrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class InterruptWatch:
    """The signal flag of this rank and its agreement with the others (see the module docstring).

    ``device`` is kept for callers that pass it; the flag never goes to the device. ``timeout_s`` bounds
    the wait for the flag's all-reduce (the run's collective timeout)."""

    def __init__(self, device: torch.device, distributed: bool, timeout_s: float | None = None) -> None:
        self.device = device
        self.distributed = distributed
        self.signum = 0
        self._signalled_at = 0.0
        self._agreed = 0  # a signal every rank knows of, waiting for a point where the run may stop
        self._previous: dict[int, object] = {}
        self._group = None
        self._pending = None  # the async all-reduce in flight (started at the previous check)
        # The host buffer the flag is reduced in: read with numpy, so reading it is never a device sync.
        self._buffer = np.zeros(1, dtype=np.int64)
        self._flag = torch.from_numpy(self._buffer)
        if distributed:  # collective: every rank creates its InterruptWatch at the same point
            timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
            self._group = dist.new_group(backend="gloo", timeout=timeout)

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in WATCHED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self.restore()
        if self._pending is not None and exc[0] is None:  # a clean end: every rank has one in flight
            self._pending.wait()
        self._pending = None

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self.signum:
            if signum == self.signum and now - self._signalled_at < REPEAT_S:
                return  # the launcher forwarding what this rank already got
            self.restore()  # second signal: the user insists
            raise KeyboardInterrupt
        self.signum, self._signalled_at = signum, now

    def check(self, defer: bool = False) -> None:
        """Raise TrainingInterrupted on every rank once the ranks agreed that one of them saw a signal.

        Every rank calls it at every loop step (the all-reduce it waits for and the next one it starts
        are collectives of the flag's group; neither blocks on the device). ``defer``: the caller is
        not at a point where it may stop (inside a gradient-accumulation window, whose gradients a
        checkpoint cannot hold); the agreed signal is kept and raised at the first check that does not
        defer. Every rank passes the same ``defer``.
        """
        if not self._agreed:
            if not self.distributed:
                self._agreed = self.signum
            else:
                if self._pending is not None:
                    self._pending.wait()
                    self._pending = None
                    self._agreed = int(self._buffer[0])
                if not self._agreed:
                    self._buffer[0] = self.signum
                    self._pending = dist.all_reduce(
                        self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True
                    )
        if self._agreed and not defer:
            raise TrainingInterrupted(self._agreed)
