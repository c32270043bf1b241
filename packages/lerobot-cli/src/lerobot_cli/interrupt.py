"""Stop cleanly on SIGINT/SIGTERM: every rank agrees on the same step, saves, then exits.

A launcher forwards the signal to each worker at slightly different moments, and a checkpoint is a
collective: a rank that stopped alone would leave the others blocked in the next all-reduce. So a
signal only sets a flag, and at every loop step the ranks all-reduce it (one int, MAX); they stop
together at the first step where any rank saw a signal, or, inside a gradient-accumulation window,
at the end of that window (so the checkpoint they save resumes exactly). A second signal falls back to the default
behaviour (KeyboardInterrupt / termination) for users who really want out now.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist

WATCHED = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class InterruptWatch:
    def __init__(self, device: torch.device, distributed: bool) -> None:
        self.device = device
        self.distributed = distributed
        self.signum = 0
        self._agreed = 0  # a signal every rank knows of, waiting for a point where the run may stop
        self._previous: dict[int, object] = {}

    def __enter__(self) -> InterruptWatch:
        if threading.current_thread() is threading.main_thread():
            for sig in WATCHED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.signum:  # second signal: the user insists
            self.restore()
            raise KeyboardInterrupt
        self.signum = signum

    def check(self, defer: bool = False) -> None:
        """Raise TrainingInterrupted on every rank once any rank has seen a signal (collective).

        ``defer``: the caller is not at a point where it may stop (inside a gradient-accumulation
        window, whose gradients a checkpoint cannot hold); the agreed signal is kept and raised at
        the first check that does not defer. Every rank passes the same ``defer``.
        """
        signum = self._agreed or self.signum
        if self.distributed and not self._agreed:
            flag = torch.tensor([signum], dtype=torch.int64, device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            signum = int(flag.item())
        self._agreed = signum
        if signum and not defer:
            raise TrainingInterrupted(signum)
