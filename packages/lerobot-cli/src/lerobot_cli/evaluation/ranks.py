"""What an evaluation needs of the data-parallel group: the lockstep vote of a sharded rollout and the
per-episode results gathered from every rank.

Lockstep: under FSDP2/HSDP every forward all-gathers each unit's weights, so every rank must call the
policy the same number of times. Before each env step, each rank says whether it still has an env running;
one all-reduce (max) tells all of them whether *any* has, and a rank whose envs are all done keeps
calling the policy (``evaluation.rollout``) until none has. Unsharded (one process, DDP), the policy's
forward is local and no vote is taken: a rank with shorter episodes reaches the gather first and waits
there, never longer than the slowest rank's share.

Failure: a rank whose rollout raises still owes its peers the collectives they wait in. A failed rank
votes once more with a failure mark, so the others stop in the same step and raise
:class:`PeerEvalFailed` instead of waiting in a collective no one will join; the gather carries the
failure the same way where no vote is taken.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from attrs import asdict

from lerobot_cli.evaluation.results import EpisodeResult


class PeerEvalFailed(RuntimeError):
    """Another rank's rollout failed (its own error is the job's)."""


class Lockstep:
    """``keep_stepping`` for :func:`~lerobot_cli.evaluation.rollout.rollout_batch`: one all-reduce per
    env step over ``group``; :meth:`fail` is the failed rank's last vote."""

    RUNNING, FAILED = 1, 2

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device) -> None:
        self.group, self.device = group, device
        self.votes = 0

    def _vote(self, value: int) -> int:
        flag = torch.tensor([value], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        self.votes += 1
        return int(flag.item())

    def __call__(self, all_done_here: bool) -> bool:
        result = self._vote(0 if all_done_here else self.RUNNING)
        if result >= self.FAILED:
            raise PeerEvalFailed("another rank's simulation eval failed")
        return result == self.RUNNING

    def fail(self) -> None:
        """Tell the ranks waiting in this step's vote that this rank failed (best effort: a peer already
        gone is the launcher's to end)."""
        with contextlib.suppress(Exception):  # the rank's own error is the one to report
            self._vote(self.FAILED)


def gather_results(
    results: Sequence[EpisodeResult] | None, group: dist.ProcessGroup | None, world_size: int
) -> list[EpisodeResult]:
    """Every rank's results (``None``: this rank failed) on every rank, sorted by episode index; raises
    :class:`PeerEvalFailed` on the ranks that did not fail when one did."""
    mine = None if results is None else [asdict(r) for r in results]
    if world_size == 1:
        gathered = [mine]
    else:
        gathered = [None] * world_size
        dist.all_gather_object(gathered, mine, group=group)
    if any(part is None for part in gathered):
        raise PeerEvalFailed("another rank's simulation eval failed")
    out = [EpisodeResult(**r) for part in gathered for r in part]
    return sorted(out, key=lambda r: r.episode_ix)


def in_lockstep(sharded: bool, group: dist.ProcessGroup | None, device: torch.device) -> Lockstep | None:
    """The vote a rollout needs: only when the policy is sharded (its forward is a collective)."""
    return Lockstep(group, device) if sharded else None


KeepStepping = Callable[[bool], bool]
