"""The tracker protocol: what every sink of a run's metrics receives, and what a tracker kind declares.

``metrics.jsonl``, trackio and wandb are trackers; a further one (tensorboard, …) is one module with one
:class:`TrackerKind` added to ``trackers.KINDS``. Only the main rank has trackers, and what they get is
already reduced over ranks (see ``reporting``), so every sink shows the numbers the console shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from attrs import define, field


@define(frozen=True)
class Record:
    """One log or eval step's numbers: ``metrics`` as the console names them (``loss``, ``data_s``, …,
    eval ones without a prefix), ``extra`` what only the records carry (a mixture's ``samples/<repo_id>``)."""

    step: int
    time_s: float  # since the run (or this resume) started
    kind: Literal["train", "eval"]
    metrics: Mapping[str, float]
    extra: Mapping[str, float] = field(factory=dict)


@define(frozen=True)
class RunContext:
    """What a tracker may need of the run when it starts (main rank)."""

    cfg: Any  # the TrainConfig
    output_dir: Path
    resuming: bool
    samples_per_step: int  # micro-batch x data-parallel ranks: LeRobot's ``samples`` per loop step
    num_frames: int
    num_episodes: int
    config: Callable[[], dict]  # the run's config as JSON (train_config.json's content)


class Tracker(Protocol):
    """A sink of records. ``log`` and ``checkpoint`` may raise: the caller reports the error once and drops
    that tracker, except for ``metrics.jsonl``, whose failure is the run's (it is the run's record)."""

    name: str

    def log(self, record: Record) -> None: ...

    def checkpoint(self, directory: Path) -> None:
        """A committed checkpoint (``checkpoints/<step>``), e.g. to keep its weights as an artifact."""

    def video(self, key: str, path: Path, step: int, fps: int) -> None:
        """An mp4 the run wrote (a simulation eval's first episode, LeRobot's ``eval/video``)."""

    def saved_config(self) -> dict[str, dict[str, Any]]:
        """Config fields to save with the run so that a resume continues it: ``{section: {field: value}}``
        (wandb's run id); empty for most."""

    def finish(self, failed: bool) -> None: ...


@define(frozen=True)
class TrackerKind:
    """A tracker the config can turn on: its flag section, when it is on, the pip extra it needs, how it
    starts (``(context, resume_in_place)``: a resume in the same directory continues the tracker's run)."""

    name: str  # its flag section: --<name>.enable
    enabled: Callable[[Any], bool]  # cfg -> on?
    start: Callable[[RunContext, bool], Tracker]
    extra: str | None = None  # lerobot-cli's pip extra that brings it


class TrackerStartError(Exception):
    """A tracker could not start (no login, no network, a run to resume that is not there): its one line."""
