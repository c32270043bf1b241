"""Finding checkpoints on disk: step directories, the ``last`` pointer, and user-given resume paths.

Readers trust only names: a directory called like a step (``005000``) appears in ``checkpoints/``
solely through the atomic rename at the end of a save, so it is complete. Dot-prefixed leftovers
of an interrupted save are never returned. ``last`` is authoritative over "highest step number":
a run resumed from an older checkpoint may leave newer, abandoned step directories behind.
Torch-free, so a CLI can resolve ``--config_path`` before importing torch.

``last`` is a symlink a run directory may carry from anywhere (a copied or downloaded run), so it is
followed only to a step directory beside it in its own ``checkpoints/``, which is what
:mod:`lerobot_ckpt.commit` writes; one that leads elsewhere (an absolute path, ``../``, a step
directory that is itself a symlink) is refused with :class:`UnsafeCheckpointError`, never followed.
"""

from __future__ import annotations

import os
from pathlib import Path

from lerobot_ckpt.errors import CheckpointNotFoundError, UnsafeCheckpointError
from lerobot_ckpt.layout import (
    CHECKPOINTS_DIR,
    EMA_PRETRAINED_MODEL_DIR,
    LAST_LINK,
    MODEL_DCP_DIR,
    OPTIMIZER_DCP_DIR,
    PRETRAINED_MODEL_DIR,
    TRAINING_STATE_DIR,
    checkpoints_dir,
    is_transient_name,
    parse_step_dir_name,
)
from lerobot_ckpt.paths import LinkedLayoutError, refuse_links_below


def list_checkpoints(checkpoints: Path | str) -> list[Path]:
    """Step directories in ``checkpoints/``, oldest step first (numeric order, not name order)."""
    root = Path(checkpoints)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        step = parse_step_dir_name(entry.name)
        if step is not None and not entry.is_symlink() and entry.is_dir():
            found.append((step, entry))
    return [path for _, path in sorted(found)]


def read_last(checkpoints: Path | str) -> Path | None:
    """Where ``checkpoints/last`` points, or None when there is no usable pointer.

    A dangling pointer only occurs on file systems without atomic directory exchange (see
    :mod:`lerobot_ckpt.commit.filesystem`) when a save replacing that very step was killed; callers fall back
    to the newest step directory.

    Raises :class:`UnsafeCheckpointError` when ``last`` leads outside its ``checkpoints/`` directory
    (see the module docstring).
    """
    link = Path(checkpoints) / LAST_LINK
    if link.is_symlink():
        target = Path(os.readlink(link))
        resolved = target if target.is_absolute() else link.parent / target
        if not os.path.lexists(resolved):
            return None
        _check_sibling(link, target, resolved)
        return resolved if resolved.is_dir() else None
    # A real directory named `last` (a copy made with `cp -L`) is still a checkpoint.
    return link if link.is_dir() else None


def _check_sibling(link: Path, target: Path, resolved: Path) -> None:
    """``last``'s target is a step directory of ``link``'s own directory once every symlink on the
    way is resolved (a sibling named by an absolute path is still a sibling)."""
    root = link.parent.resolve()
    real = resolved.resolve()
    if real.parent != root or parse_step_dir_name(real.name) is None:
        raise UnsafeCheckpointError(
            f"{link} points to {target} (that is {real}), which is not a step directory of {root}; "
            "`last` is only followed to a checkpoint beside it, so it was not: point it at one "
            f"(ln -sfn <step> {link}) or pass the checkpoint you mean itself as --config_path"
        )


def _check_last_on_the_way(given: Path) -> None:
    """Any ``last`` symlink among ``given`` and its parents, checked as :func:`read_last` does
    (``--config_path=run/checkpoints/last/pretrained_model/train_config.json`` goes through it)."""
    for path in (given, *given.parents):
        if path.name == LAST_LINK and path.is_symlink():
            read_last(path.parent)


def through_last(given: Path | str) -> Path:
    """``given`` made absolute, with every ``checkpoints/last`` on the way replaced by the step
    directory it points at (checked as :func:`read_last` does); no other symlink is resolved."""
    parts = Path(given).expanduser().absolute().parts
    current = Path(parts[0])
    for part in parts[1:]:
        current = current / part
        if part == LAST_LINK and current.is_symlink():
            target = read_last(current.parent)
            if target is not None:  # a checked sibling: its real name is a step directory of current.parent
                current = current.parent / target.resolve().name
    return current


def resolve_last(checkpoints: Path | str) -> Path:
    """``checkpoints/last`` as a step directory, with an error that says what to do otherwise."""
    root = Path(checkpoints)
    target = read_last(root)
    if target is not None:
        return target
    steps = list_checkpoints(root)
    hint = f"; the newest step directory is {steps[-1]}" if steps else ""
    link = root / LAST_LINK
    if link.is_symlink():
        raise CheckpointNotFoundError(
            f"{link} points to {os.readlink(link)}, which does not exist (a save was interrupted){hint}"
        )
    raise CheckpointNotFoundError(f"{link} does not exist: no checkpoint has been committed in {root}{hint}")


def latest_checkpoint(output_dir: Path | str) -> Path | None:
    """The checkpoint a resumed run should continue from: ``last``, else the highest step, else None."""
    root = checkpoints_dir(output_dir)
    target = read_last(root)
    if target is not None:
        return target
    steps = list_checkpoints(root)
    return steps[-1] if steps else None


def _is_step_dir(path: Path) -> bool:
    return (path / TRAINING_STATE_DIR).is_dir() or (path / PRETRAINED_MODEL_DIR).is_dir()


def resolve_checkpoint_dir(path: Path | str) -> Path:
    """The step directory meant by a user-given path.

    Accepts ``…/pretrained_model/train_config.json`` (what ``--config_path`` names), any file in
    ``pretrained_model/``, ``pretrained_model/`` itself, the step directory, ``checkpoints/last``,
    ``checkpoints/`` or the run's output directory (both meaning "the latest"). The result never
    names ``last`` (a checked ``last`` is replaced by the step directory it points at); no other
    symlink is resolved, so the run directory is the one the user named (theirs may be a symlink).
    Inside the checkpoint nothing may be a symlink (:func:`refuse_links_in_checkpoint`): a linked
    step directory, ``pretrained_model/``, ``training_state/`` or file could lead into another run,
    which a resume would then read, or write into. It does not check that the checkpoint is
    resumable: loading does that and says what is missing.
    """
    given = Path(path).expanduser()
    _check_last_on_the_way(given.absolute())
    if not given.exists() and not given.is_symlink():
        raise CheckpointNotFoundError(f"{given} does not exist")
    if given.is_symlink() and not given.exists():
        raise CheckpointNotFoundError(f"{given} is a symlink to {os.readlink(given)}, which does not exist")
    real = through_last(given)
    if real.is_file():
        if real.parent.name == PRETRAINED_MODEL_DIR:
            return refuse_links_in_checkpoint(real.parent.parent)
        raise CheckpointNotFoundError(
            f"{given} is a file outside a checkpoint's {PRETRAINED_MODEL_DIR}/: pass the step directory, "
            f"{PRETRAINED_MODEL_DIR}/train_config.json or checkpoints/last"
        )
    if real.is_symlink() and not is_layout_name(real.name) and _is_step_dir(real):
        real = real.resolve()  # the user's own alias of a step directory
    if real.name == PRETRAINED_MODEL_DIR and not (real / TRAINING_STATE_DIR).is_dir():
        return refuse_links_in_checkpoint(real.parent)
    if _is_step_dir(real):
        return refuse_links_in_checkpoint(real)
    for checkpoints in (real / CHECKPOINTS_DIR, real):
        named = checkpoints.name == CHECKPOINTS_DIR or (checkpoints / LAST_LINK).is_symlink()
        if named and checkpoints.is_dir():
            latest = read_last(checkpoints) or next(reversed(list_checkpoints(checkpoints)), None)
            if latest is None:
                resolve_last(checkpoints)  # raises with the reason (no pointer, or a dangling one)
            return refuse_links_in_checkpoint(checkpoints.absolute() / latest.resolve().name)
    raise CheckpointNotFoundError(
        f"{given} is not a checkpoint: expected a step directory (with {TRAINING_STATE_DIR}/ and "
        f"{PRETRAINED_MODEL_DIR}/), its {PRETRAINED_MODEL_DIR}/train_config.json, or checkpoints/last"
    )


def is_layout_name(name: str) -> bool:
    """A name only a checkpoint's layout uses (a step directory, ``pretrained_model/``, …): a symlink
    by that name is part of a checkpoint, not a user's alias of one."""
    return parse_step_dir_name(name) is not None or name in (
        PRETRAINED_MODEL_DIR,
        EMA_PRETRAINED_MODEL_DIR,
        TRAINING_STATE_DIR,
        MODEL_DCP_DIR,
        OPTIMIZER_DCP_DIR,
    )


def refuse_links_in_checkpoint(step: Path | str) -> Path:
    """``step``, once neither it nor anything in its ``pretrained_model/``, ``pretrained_model_ema/``
    or ``training_state/`` (files, shard directories and their files) is a symlink
    (:class:`~lerobot_ckpt.paths.LinkedLayoutError`, one line). A checkpoint is written without
    any, so one there was planted: it would make a resume read another run's state as this one's,
    or write its checkpoints into that run."""
    step = Path(step)
    what = "a part of a checkpoint's layout"
    if step.is_symlink():
        raise LinkedLayoutError(step, what)
    for name in (PRETRAINED_MODEL_DIR, EMA_PRETRAINED_MODEL_DIR, TRAINING_STATE_DIR):
        refuse_links_below(step / name, what, depth=2)
    return step


def newer_checkpoints(checkpoints: Path | str, step: int) -> list[Path]:
    """Committed step directories after ``step`` (what resuming from ``step`` in place would supersede)."""
    return [p for p in list_checkpoints(checkpoints) if (parse_step_dir_name(p.name) or 0) > step]


def transient_leftovers(checkpoints: Path | str) -> list[Path]:
    """Dot-prefixed leftovers of interrupted saves (a staging tree, a half-swapped link),
    oldest name first."""
    root = Path(checkpoints)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if is_transient_name(p.name))
