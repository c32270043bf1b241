"""What an evaluation needs of the data-parallel group: a vote before every env step, and the per-episode
results gathered from every rank.

The vote (:class:`Lockstep`, the rollout's ``keep_stepping``): before each env step every rank says
whether it still has an env running, whether it got SIGINT/SIGTERM, and whether its eval failed; one
all-reduce (max) of the three tells every rank the same. So:

- under FSDP2/HSDP, where every forward all-gathers each unit's weights, every rank calls the policy the
  same number of times: a rank whose envs are all done keeps calling it (``evaluation.rollout``) until no
  rank has an env running;
- a signal stops the eval on every rank at the same step (:class:`EvalInterrupted`), however long the
  eval would still take; the run then stops and saves as it does during training;
- a rank whose eval raised votes once more, marked failed, and the others raise :class:`PeerEvalFailed`
  at that vote instead of waiting in a collective no one will join; the vote also names the lowest failed
  rank, so when every rank fails alike (a policy bug) one of them says why. A last vote after the
  rollouts (:meth:`Lockstep.finish`) keeps a failure after the last step (a video write) on the same
  channel. The failed rank waits for its vote a few seconds at most (:data:`FAIL_WAIT_S`): a peer stuck
  elsewhere (inside a sharded forward) is the launcher's to end once this rank exits;
- a vote that fails (a peer killed: the connection closed) raises :class:`PeerLost`; so does, in effect,
  a sharded forward's collective that fails when the failure vote after it cannot complete either
  (:func:`raised_in_a_collective`): the peer is gone, whichever collective saw it first.

On one process the vote is local: it reads the signal flag and says whether an env is running. The vote
costs one small all-reduce per env step; every rank waits for the slowest at each step instead of at the
end, which takes as long in total.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from attrs import asdict

from lerobot_cli.evaluation.results import EpisodeResult


class PeerEvalFailed(RuntimeError):
    """Another rank's eval failed (its own error is the job's)."""


class PeerLost(RuntimeError):
    """A vote failed: another rank is gone (killed or crashed; the launcher's report names it)."""


FAIL_WAIT_S = 10.0  # how long a failed rank waits for its last vote
_DISTRIBUTED = f"{os.sep}torch{os.sep}distributed{os.sep}"


def first_line(exc: BaseException) -> str:
    """An error's first line (its type's name when it says nothing): what a one-line report quotes."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def raised_in_a_collective(exc: BaseException) -> bool:
    """Whether ``exc`` came out of torch.distributed: a ``DistError``, or an error whose innermost Python
    frame is torch.distributed's (gloo reports a peer's closed connection inside a sharded forward's
    all-gather as a plain ``RuntimeError``). Read with a vote that could not complete, it means a peer is
    gone, not that this rank's eval went wrong."""
    if isinstance(exc, dist.DistError):
        return True
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return _DISTRIBUTED in tb.tb_frame.f_code.co_filename


class EvalInterrupted(RuntimeError):
    """A rank got SIGINT/SIGTERM during the eval: every rank stops it at the same vote."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class Lockstep:
    """``keep_stepping`` for :func:`~lerobot_cli.evaluation.rollout.rollout_batch` (see the module
    docstring). ``signalled()`` returns this rank's pending signal number (0: none)."""

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        device: torch.device,
        world_size: int,
        signalled: Callable[[], int] = lambda: 0,
        rank: int = 0,
    ) -> None:
        self.group, self.device, self.world_size, self.signalled = group, device, world_size, signalled
        self.rank = rank

    def _vote(
        self, running: bool, failed: bool = False, wait_s: float | None = None
    ) -> tuple[bool, int, int]:
        """(any rank running, the largest pending signal, ``world - lowest failed rank`` or 0)."""
        values = [int(running), int(self.signalled()), self.world_size - self.rank if failed else 0]
        if self.world_size > 1:
            flags = torch.tensor(values, dtype=torch.int64, device=self.device)
            try:
                work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
                if wait_s is None:
                    work.wait()
                else:
                    work.wait(timeout=datetime.timedelta(seconds=wait_s))
            except RuntimeError as exc:  # gloo: "Connection closed by peer"; a collective timeout
                raise PeerLost(first_line(exc)) from exc
            values = flags.tolist()
        return bool(values[0]), values[1], values[2]

    def _checked(self, running: bool) -> bool:
        running, signum, failed = self._vote(running)
        if failed:
            raise PeerEvalFailed("another rank's evaluation failed")
        if signum:
            raise EvalInterrupted(signum)
        return running

    def __call__(self, all_done_here: bool) -> bool:
        return self._checked(not all_done_here)

    def finish(self) -> None:
        """The vote after this rank's last rollout: every rank reaches it unless one failed."""
        self._checked(False)

    def fail(self) -> int | None:
        """Tell the ranks waiting in a vote that this rank failed; returns the lowest rank that failed in
        this vote (this one, alone), or None when the vote did not complete within :data:`FAIL_WAIT_S`
        (a peer gone or stuck: the launcher's to end)."""
        try:
            failed = self._vote(False, failed=True, wait_s=FAIL_WAIT_S)[2]
        except PeerLost:
            return None
        return self.world_size - failed


def gather_results(
    results: Sequence[EpisodeResult], group: dist.ProcessGroup | None, world_size: int
) -> list[EpisodeResult]:
    """Every rank's results on every rank, sorted by episode index. Called once every rank passed the last
    vote (:meth:`Lockstep.finish`): a failure has already been told through the votes."""
    mine = [asdict(r) for r in results]
    gathered = [mine]
    if world_size > 1:
        gathered = [None] * world_size
        dist.all_gather_object(gathered, mine, group=group)
    out = [EpisodeResult(**r) for part in gathered for r in part]
    return sorted(out, key=lambda r: r.episode_ix)
