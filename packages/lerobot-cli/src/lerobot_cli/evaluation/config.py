"""``--eval.*``: LeRobot 0.6.1's ``EvalConfig`` (``lerobot.configs.default``), its fields, defaults and
resolution. Torch-free.

``batch_size`` is the number of envs in one vector env (per rank, under data parallelism); 0 asks for
LeRobot's automatic size, ``min(floor(0.7 * cpu_count), n_episodes, 64)``, and any size is capped at
``n_episodes``, as LeRobot does. The automatic size depends on the machine: every rank must roll out the
same batches (``evaluation.plan``), so a run resolves it once, on one process, and hands the number to
the others (and records it), never letting each rank resolve its own.
"""

from __future__ import annotations

import math
import os

from attrs import define, field


def _count(flag: str, low: int):
    def check(inst, attribute, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"--eval.{flag} must be an integer >= {low}, got {value!r}")

    return check


@define(frozen=True, kw_only=True)
class EvalConfig:
    """How many episodes an eval rolls out, in vector envs of how many envs, sync or async."""

    n_episodes: int = field(default=50, validator=_count("n_episodes", 1))
    batch_size: int = field(default=0, validator=_count("batch_size", 0))  # 0: automatic
    use_async_envs: bool = True  # one env per process (forkserver); a vector env of one is always sync
    recording: bool = False
    recording_repo_id: str | None = None
    recording_private: bool = False

    def __attrs_post_init__(self) -> None:
        if self.recording_repo_id is not None and not self.recording:
            raise ValueError("--eval.recording_repo_id requires --eval.recording=true")

    def resolved_batch_size(self, cpu_count: int | None = None) -> int:
        """The number of envs per vector env: LeRobot's ``__post_init__`` arithmetic. ``cpu_count``
        defaults to this machine's (``os.cpu_count()``, 4 when unknown, as LeRobot)."""
        size = self.batch_size
        if size == 0:
            cores = cpu_count if cpu_count is not None else (os.cpu_count() or 4)
            size = min(max(1, math.floor(cores * 0.7)), self.n_episodes, 64)
        return min(size, self.n_episodes)
