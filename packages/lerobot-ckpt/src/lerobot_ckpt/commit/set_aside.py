"""Set committed checkpoints aside instead of overwriting them (a resume from an older step).

A run resumed from step 2 while steps 4 and 6 exist would write its own step 4 over the old one.
When the user asks for it, the newer step directories are *moved* (never deleted, never rewritten in
place) into a directory of the caller's choosing, and ``last`` is pointed at the step the run
resumes from, so every reader sees one consistent history. Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

from lerobot_ckpt.commit.filesystem import fsync_dir, swap_symlink
from lerobot_ckpt.errors import CheckpointWriteError
from lerobot_ckpt.layout import LAST_LINK, link_staging_name
from lerobot_ckpt.paths import refuse_link


def set_aside(step_dirs: list[Path], destination: Path, *, point_last_at: Path) -> list[Path]:
    """Move ``step_dirs`` (committed step directories of one ``checkpoints/``) into ``destination``
    and point ``checkpoints/last`` at ``point_last_at``; returns the new locations.

    ``last`` is re-pointed first, so a crash in between leaves it on a complete checkpoint.
    ``destination`` must not exist yet (its parent is the caller's, created by it): it is created
    here exclusively, so a directory or a symlink planted under that name is refused
    (:class:`CheckpointWriteError`) before anything moves, never moved into.
    """
    if not step_dirs:
        return []
    refuse_link(destination, "setting checkpoints aside")
    if os.path.lexists(destination):
        raise CheckpointWriteError(
            f"{destination} already exists; checkpoints are set aside only into a directory created for "
            "them: give a new destination",
            path=destination,
        )
    checkpoints = point_last_at.parent
    swap_symlink(checkpoints / LAST_LINK, point_last_at.name, link_staging_name(os.getpid()))
    destination.mkdir(parents=True)
    moved = []
    for path in step_dirs:
        target = destination / path.name
        os.rename(path, target)
        moved.append(target)
    fsync_dir(destination)
    fsync_dir(checkpoints)
    return moved
