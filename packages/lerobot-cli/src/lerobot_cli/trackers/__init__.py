"""Where a run's metrics go: ``metrics.jsonl`` always, trackio and wandb on request, several at once.

Each sink is a :class:`~lerobot_cli.trackers.base.Tracker`; each optional one is a
:class:`~lerobot_cli.trackers.base.TrackerKind` in :data:`KINDS` (its flag section, its extra, how it
starts), so the CLI's checks, the runner and the reporter never name a tracker. Adding one (tensorboard,
…) is a module and a line here.

Only the main rank starts trackers. A tracker that fails while the run goes on (a lost connection) is
reported in one warning and dropped, so a dashboard never stops a training run; ``metrics.jsonl``'s
failure is the run's, as it is the run's record.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path

from lerobot_cli.trackers.base import Record, RunContext, Tracker, TrackerKind, TrackerStartError
from lerobot_cli.trackers.jsonl import METRICS_FILE, MetricsFile

__all__ = [
    "KINDS",
    "METRICS_FILE",
    "Record",
    "RunContext",
    "Tracker",
    "TrackerKind",
    "TrackerStartError",
    "Trackers",
    "enabled_kinds",
]


def _start_trackio(ctx: RunContext, resume_in_place: bool) -> Tracker:
    from lerobot_cli.trackers.trackio import TrackioTracker

    return TrackioTracker.start(ctx)


def _start_wandb(ctx: RunContext, resume_in_place: bool) -> Tracker:
    from lerobot_cli.trackers.wandb import WandbTracker

    return WandbTracker.start(ctx, resume_in_place)


KINDS: tuple[TrackerKind, ...] = (
    TrackerKind("trackio", enabled=lambda cfg: cfg.trackio.enable, start=_start_trackio, extra="trackio"),
    TrackerKind("wandb", enabled=lambda cfg: cfg.wandb.enable, start=_start_wandb, extra="wandb"),
)


def enabled_kinds(cfg) -> list[TrackerKind]:
    return [kind for kind in KINDS if kind.enabled(cfg)]


class Trackers:
    """The run's trackers as one: ``metrics.jsonl`` first, then the optional ones in :data:`KINDS` order."""

    def __init__(self, trackers: Iterable[Tracker]) -> None:
        self._all: list[Tracker] = list(trackers)
        self._log = logging.getLogger("lerobot-train")

    @classmethod
    def start(cls, ctx: RunContext, resume_in_place: bool) -> Trackers:
        """``metrics.jsonl`` and every enabled kind; one failing to start finishes those already started
        and raises its :class:`TrackerStartError`."""
        started: list[Tracker] = [MetricsFile(ctx.output_dir)]
        try:
            for kind in enabled_kinds(ctx.cfg):
                started.append(kind.start(ctx, resume_in_place))
        except BaseException:
            cls(started).finish(failed=True)
            raise
        return cls(started)

    @classmethod
    def file_only(cls, output_dir: Path) -> Trackers:
        return cls([MetricsFile(output_dir)])

    @property
    def names(self) -> list[str]:
        return [getattr(t, "label", t.name) for t in self._all]

    def saved_config(self) -> dict[str, dict]:
        """What the trackers need saved with the run (``{section: {field: value}}``)."""
        merged: dict[str, dict] = {}
        for tracker in self._all:
            for section, values in tracker.saved_config().items():
                merged.setdefault(section, {}).update(values)
        return merged

    def _each(self, what: str, call) -> None:
        for tracker in list(self._all):
            if isinstance(tracker, MetricsFile):
                call(tracker)  # the run's own record: its failure is the run's
                continue
            try:
                call(tracker)
            except Exception as exc:  # noqa: BLE001 - any tracker error: said once, the run goes on
                self._all.remove(tracker)
                self._log.warning(
                    f"{tracker.name} failed to {what} ({type(exc).__name__}: {' '.join(str(exc).split())}); "
                    f"it is off for the rest of the run (metrics.jsonl has every record)"
                )
                with contextlib.suppress(Exception):  # already reported
                    tracker.finish(failed=True)

    def log(self, record: Record) -> None:
        self._each(f"log step {record.step}", lambda t: t.log(record))

    def checkpoint(self, directory: Path) -> None:
        self._each(f"record checkpoint {Path(directory).name}", lambda t: t.checkpoint(directory))

    def video(self, key: str, path: Path, step: int, fps: int) -> None:
        self._each(f"log the video {Path(path).name}", lambda t: t.video(key, Path(path), step, fps))

    def finish(self, failed: bool = False) -> None:
        trackers, self._all = self._all, []
        errors = []
        for tracker in trackers:
            try:
                tracker.finish(failed)
            except Exception as exc:  # noqa: BLE001 - finish every one, then report
                errors.append(f"{tracker.name} ({type(exc).__name__}: {exc})")
        if errors:
            self._log.warning(f"could not finish the tracker(s): {'; '.join(errors)}")
