"""The run directory: what a fresh run may reuse, and what a resume sets aside before step 1.

One run owns its ``output_dir`` (``lerobot_ckpt.RunLock``). Under that lock the main rank decides,
from the files alone, whether the directory may be used:

* a fresh run takes an empty directory, or one an earlier run left without any committed
  checkpoint (a failed start, a run killed before or during its first save): that run's
  ``metrics.jsonl`` is kept under ``abandoned/`` and its interrupted save removed, with one note;
  anything else (checkpoints, files of the user's) is refused;
* a resume in place removes interrupted saves, moves checkpoints newer than the one it resumes
  from (only when asked, see ``runplan``) and the ``metrics.jsonl`` lines after its step (the
  part of the run that is being redone) under ``abandoned/``: nothing is deleted that a user
  could want, and no step appears twice in ``metrics.jsonl``.

Checks happen before the model is built; the moves happen just before the first step (``apply``),
so a run refused in between leaves the directory as it was. A run directory may be one somebody
sent (resumed in place), so nothing here writes through a name it holds: ``metrics.jsonl`` or
``abandoned/`` being a symlink is refused in one line at the check, and rewritten files go through a
fresh ``mkstemp`` name renamed over them (a fixed ``.tmp-<pid>`` name could be a planted symlink).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import stat
import tempfile
from pathlib import Path

from attrs import define
from lerobot_ckpt import (
    LockHolder,
    fsync_dir,
    list_checkpoints,
    read_last,
    remove_quietly,
    set_aside,
    step_dir_name,
    transient_leftovers,
)
from lerobot_ckpt.commit.filesystem import staged_sibling
from lerobot_ckpt.layout import ABANDONED_DIR, CHECKPOINTS_DIR, LAST_LINK, RUN_LOCK

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.reporting import METRICS_FILE
from lerobot_cli.runplan import RunPlan

WANDB_DIR = "wandb"  # --wandb.enable: wandb's own files (dir=<output_dir>), a folder per run or resume


def _metrics_lines(path: Path) -> list[str]:
    try:
        return [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except FileNotFoundError:
        return []


def _line_step(line: str) -> int | None:
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def _write_lines(path: Path, lines: list[str]) -> None:
    """Replace ``path`` by ``lines`` atomically, through a new file of our own (never a planted name)."""
    tmp, f = staged_sibling(path)
    try:
        with f:
            f.write("".join(ln + "\n" for ln in lines).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _refuse_links(directory: Path) -> None:
    """The names a run writes or moves into at its top level must not lead elsewhere."""
    for name, what in (
        (METRICS_FILE, "its metrics are appended to"),
        (ABANDONED_DIR, "it moves files into"),
        (WANDB_DIR, "wandb writes its run files into"),
    ):
        path = directory / name
        if path.is_symlink():
            raise UsageError(
                f"--output_dir={directory} holds {name} as a symlink (to {os.readlink(path)}), a name "
                f"{what}: a run never writes through a symlink; remove it or choose another --output_dir "
                "(nothing was changed)"
            )
    abandoned = directory / ABANDONED_DIR
    if abandoned.exists() and not abandoned.is_dir():
        raise UsageError(
            f"--output_dir={directory} holds {ABANDONED_DIR} as something other than a directory, a name "
            "it moves files into; remove it or choose another --output_dir (nothing was changed)"
        )


def _new_aside(directory: Path, name: str) -> Path:
    """A directory of this run's own under ``directory/abandoned``, created here and now.

    ``abandoned/`` came with the run directory and may hold anything, including symlinks planted
    under the names this would pick (``<timestamp>-after-<step>``): the directory is created
    exclusively (``mkdir``, else ``mkdtemp``), never reused, so nothing is moved or written through a
    name somebody else made."""
    abandoned = directory / ABANDONED_DIR
    try:
        abandoned.mkdir()
    except FileExistsError:
        pass
    info = os.lstat(abandoned)
    if not stat.S_ISDIR(info.st_mode):  # a symlink (or a file) swapped in since the check
        raise UsageError(
            f"--output_dir={directory} holds {ABANDONED_DIR} as a symlink or a file, a name it moves files "
            "into: a run never writes through a symlink; remove it or choose another --output_dir"
        )
    aside = abandoned / name
    try:
        aside.mkdir()
    except FileExistsError:
        aside = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=abandoned))
    fsync_dir(abandoned)
    return aside


@define
class RunDirWork:
    """What the main rank does to the run directory before the first step."""

    directory: Path
    leftovers: tuple[Path, ...] = ()  # interrupted saves' dot-named leftovers in checkpoints/
    earlier_metrics: int = 0  # fresh run: lines of an earlier run (without checkpoints) to set aside
    earlier_wandb: bool = False  # fresh run: the wandb/ files of that earlier run, set aside too
    set_aside_steps: tuple[Path, ...] = ()  # resume: newer checkpoints the user asked to set aside
    resume_checkpoint: Path | None = None
    stale_lock: LockHolder | None = None

    def _aside(self, resume_step: int | None) -> Path:
        """A new, empty directory under ``abandoned/`` (see :func:`_new_aside`)."""
        now = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        name = (
            f"{now}-after-{step_dir_name(resume_step)}" if resume_step is not None else f"{now}-earlier-run"
        )
        return _new_aside(self.directory, name)

    def apply(self) -> list[str]:
        """Do it; returns the notes to print once."""
        notes = []
        if self.stale_lock is not None:
            notes.append(
                f"the run directory's lock was left by {self.stale_lock.describe()}, which ended without "
                "releasing it (killed or crashed); this run took it over"
            )
        for path in self.leftovers:
            remove_quietly(path)
        if self.leftovers:
            notes.append(
                f"removed what an interrupted save left in {self.directory / CHECKPOINTS_DIR}: "
                + ", ".join(p.name for p in self.leftovers)
            )
        metrics = self.directory / METRICS_FILE
        if self.resume_checkpoint is None:
            moved = []
            if self.earlier_metrics or self.earlier_wandb:
                aside = self._aside(None)
                if self.earlier_metrics:
                    os.replace(metrics, aside / METRICS_FILE)
                    moved.append(f"its {METRICS_FILE} ({self.earlier_metrics} lines)")
                if self.earlier_wandb:
                    os.replace(self.directory / WANDB_DIR, aside / WANDB_DIR)
                    moved.append(f"its {WANDB_DIR}/")
                notes.append(
                    f"{self.directory} held an earlier run that committed no checkpoint: starting afresh "
                    f"there; {' and '.join(moved)} moved to {aside}"
                )
            return notes
        step = int(self.resume_checkpoint.name)
        aside: Path | None = None
        if self.set_aside_steps:
            aside = self._aside(step)
            moved = set_aside(
                list(self.set_aside_steps), aside / CHECKPOINTS_DIR, point_last_at=self.resume_checkpoint
            )
            notes.append(
                f"set aside the checkpoints newer than {self.resume_checkpoint.name} "
                f"({', '.join(p.name for p in moved)}) in {aside / CHECKPOINTS_DIR}"
            )
        lines = _metrics_lines(metrics)
        later = [ln for ln in lines if (_line_step(ln) or 0) > step]
        if later:
            aside = aside if aside is not None else self._aside(step)
            _write_lines(aside / METRICS_FILE, later)
            _write_lines(metrics, [ln for ln in lines if (_line_step(ln) or 0) <= step])
            notes.append(
                f"{METRICS_FILE} had {len(later)} line(s) after step {step}, from the part of the run this "
                f"resume redoes; they were moved to {aside / METRICS_FILE}"
            )
        return notes


def _not_empty(directory: Path, why: str) -> UsageError:
    return UsageError(
        f"--output_dir={directory} already exists and {why}; pass --resume=true --config_path=… to continue "
        "that run, or choose another --output_dir (nothing was changed)"
    )


def inspect_run_dir(plan: RunPlan, stale_lock: LockHolder | None = None) -> RunDirWork:
    """Decide (read-only) what the run may do to its directory; raises UsageError when it may not."""
    cfg = plan.cfg
    directory = Path(cfg.output_dir)
    _refuse_links(directory)
    checkpoints = directory / CHECKPOINTS_DIR
    leftovers = tuple(transient_leftovers(checkpoints))
    resume = plan.resume
    if resume is not None and resume.in_place:
        return RunDirWork(
            directory=directory,
            leftovers=leftovers,
            set_aside_steps=resume.abandon,
            resume_checkpoint=resume.checkpoint,
            stale_lock=stale_lock,
        )
    entries = {p.name: p for p in directory.iterdir()} if directory.is_dir() else {}
    entries.pop(RUN_LOCK, None)
    if resume is not None:  # a branch of another run's checkpoint starts in a directory of its own
        if entries:
            raise resume.branch_refusal(directory)
        return RunDirWork(directory=directory, stale_lock=stale_lock)
    last = read_last(checkpoints)
    committed = list_checkpoints(checkpoints) or ([last] if last else [])
    if committed:
        raise _not_empty(
            directory,
            f"holds checkpoints of an earlier run ({checkpoints / LAST_LINK} or {committed[-1].name})",
        )
    if CHECKPOINTS_DIR in entries and any(p not in leftovers for p in checkpoints.iterdir()):
        raise _not_empty(directory, f"is not empty ({checkpoints} holds files that are not checkpoints)")
    others = sorted(set(entries) - {CHECKPOINTS_DIR, METRICS_FILE, ABANDONED_DIR, WANDB_DIR})
    if others:
        raise _not_empty(directory, f"is not empty (it holds {', '.join(others[:5])})")
    if METRICS_FILE in entries and not entries[METRICS_FILE].is_file():
        raise _not_empty(directory, f"is not empty ({METRICS_FILE} is not a file)")
    if WANDB_DIR in entries and not entries[WANDB_DIR].is_dir():
        raise _not_empty(directory, f"is not empty ({WANDB_DIR} is not a directory)")
    earlier = len(_metrics_lines(directory / METRICS_FILE)) if METRICS_FILE in entries else 0
    return RunDirWork(
        directory=directory,
        leftovers=leftovers,
        earlier_metrics=earlier,
        earlier_wandb=WANDB_DIR in entries,
        stale_lock=stale_lock,
    )
