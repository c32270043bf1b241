"""The main rank's commit transaction: write under a dot-name, fsync, rename, swap ``last``.

Order is what makes a kill harmless at any instant:

1. leftovers of earlier interrupted saves are removed (never the directory ``last`` points to);
2. everything is written into ``checkpoints/.tmp-<step>-<pid>/`` (invisible to readers), a
   directory this process has just created with ``mkdir`` (never an existing one, never through a
   symlink), so nobody else's file can be waiting under a name the writers create there;
3. the staged tree is fsynced, then renamed to ``<step>`` (or atomically exchanged with an existing
   ``<step>`` when a resumed run saves the same step again), and ``checkpoints/`` is fsynced;
4. ``last`` is re-pointed by renaming a fresh symlink over it.

Until step 3 the previous checkpoint and ``last`` are untouched, so a failed write only has to
remove the staging directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from attrs import define, field

from lerobot_ckpt.commit.filesystem import exchange, fsync_dir, fsync_tree, remove_quietly, swap_symlink
from lerobot_ckpt.layout import (
    LAST_LINK,
    CheckpointPaths,
    aside_dir_name,
    is_transient_name,
    link_staging_name,
    staging_dir_name,
    step_dir_name,
)


def clean_leftovers(checkpoints: Path) -> list[Path]:
    """Remove what interrupted saves left (dot-prefixed names), sparing ``last``'s target."""
    if not checkpoints.is_dir():
        return []
    link = checkpoints / LAST_LINK
    protected = link.resolve() if link.is_symlink() else None
    removed = []
    for entry in checkpoints.iterdir():
        if not is_transient_name(entry.name):
            continue
        if not entry.is_symlink() and protected is not None and entry.resolve() == protected:
            continue  # only possible after a manual repair; a directory `last` needs is never garbage
        remove_quietly(entry)
        removed.append(entry)
    return removed


@define
class StagedCheckpoint:
    """A step directory being written; ``paths`` points into the staging twin until :meth:`commit`."""

    checkpoints: Path
    step: int
    staging: Path
    renamed: bool = field(default=False)  # the step directory holds the new checkpoint
    committed: Path | None = field(default=None)  # ... and `last` points at it

    @classmethod
    def begin(cls, checkpoints: Path, step: int) -> StagedCheckpoint:
        created = not checkpoints.is_dir()
        checkpoints.mkdir(parents=True, exist_ok=True)
        if created:
            fsync_dir(checkpoints.parent)
        clean_leftovers(checkpoints)
        staging = checkpoints / staging_dir_name(step, os.getpid())
        if staging.exists() or staging.is_symlink():
            remove_quietly(staging)
        staging.mkdir()  # ours alone: mkdir never follows or reuses a name (a planted symlink fails here)
        paths = CheckpointPaths(staging)
        paths.pretrained_model.mkdir()
        paths.training_state.mkdir()
        return cls(checkpoints=checkpoints, step=step, staging=staging)

    @property
    def paths(self) -> CheckpointPaths:
        return CheckpointPaths(self.staging)

    @property
    def final(self) -> Path:
        return self.checkpoints / step_dir_name(self.step)

    def commit(self) -> Path:
        """Make the staged tree the step directory and point ``last`` at it; returns the step dir."""
        fsync_tree(self.staging)
        final = self.final
        if final.is_dir() and not final.is_symlink():
            self._replace(final)
        else:
            os.rename(self.staging, final)
            fsync_dir(self.checkpoints)
        self.renamed = True
        swap_symlink(self.checkpoints / LAST_LINK, final.name, link_staging_name(os.getpid()))
        self.committed = final
        return final

    def _replace(self, final: Path) -> None:
        if exchange(self.staging, final):
            fsync_dir(self.checkpoints)
            # The staging name now holds the superseded contents. If `last` still points at
            # `final` it already sees the new checkpoint; removal can wait for a later cleanup.
            return
        # No atomic exchange here (e.g. NFS): move the old step aside first. Between the two
        # renames `last` may dangle if it pointed at this step; readers fall back to the newest
        # step directory (see discovery.read_last).
        aside = self.checkpoints / aside_dir_name(self.step, os.getpid())
        os.rename(final, aside)
        try:
            os.rename(self.staging, final)
        except OSError:
            os.rename(aside, final)
            raise
        fsync_dir(self.checkpoints)

    def finish(self) -> None:
        """Drop what the commit superseded (best effort: a failure leaves a harmless dot-name)."""
        for name in (self.staging.name, aside_dir_name(self.step, os.getpid())):
            path = self.checkpoints / name
            if path.exists() or path.is_symlink():
                remove_quietly(path)

    def abort(self) -> None:
        """After a failed write: remove the half-written staging tree; nothing else was touched."""
        if self.committed is None and (self.staging.exists() or self.staging.is_symlink()):
            remove_quietly(self.staging)
