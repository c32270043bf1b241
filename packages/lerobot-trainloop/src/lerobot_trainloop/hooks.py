"""Hook scheduling: which loop steps a callback (logging, saving, evaluation) runs after.

Hooks are scheduled by loop-step number only, so every rank runs the same hooks at the same
steps. That matters: a hook that asks for reduced metrics triggers a collective, and saving
is collective too; a schedule that differed between ranks would deadlock.

Before the hooks due at a step run, the loop reads what the device holds (the non-finite-loss
record, and the metric window when one of them asks for metrics): a host sync, and a collective when
distributed. A hook that reads nothing of the step (a progress bar, an interrupt check) says so with
``check_finite=False``, so a step where only such hooks are due costs no sync at all.

This module knows nothing of the loop (what a hook receives, ``StepEvent``, is the loop's: see
:mod:`lerobot_trainloop.loop`), so it imports none of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from attrs import define, field
from lerobot_parallel.validators import count

Hook = Callable[[Any], Any]  # called with the loop's StepEvent


@define(frozen=True)
class ScheduledHook:
    fn: Hook
    every: int | None = field(default=None, validator=count("hook every", optional=True))
    at: frozenset[int] = field(factory=frozenset, converter=frozenset)
    metrics: bool = False
    check_finite: bool = True  # read the non-finite-loss record before this hook runs

    def __attrs_post_init__(self) -> None:
        if self.every is None and not self.at:
            raise ValueError("a hook needs a schedule: every=N and/or at=[steps]")

    def due(self, step: int) -> bool:
        return (self.every is not None and step % self.every == 0) or step in self.at


def schedule(
    fn: Hook,
    every: int | None = None,
    at: Iterable[int] = (),
    metrics: bool = False,
    check_finite: bool = True,
) -> ScheduledHook:
    return ScheduledHook(fn=fn, every=every, at=frozenset(at), metrics=metrics, check_finite=check_finite)
