"""The one rule for a path that comes from a file, and the one way to create a file.

A checkpoint, a processor file, an adapter or a config is untrusted: whoever sent it chose every
string in it. A name such a file gives (a DCP chunk's ``relative_path``, a processor step's
``state_file``, an adapter's weights file) is therefore followed only when it is a plain relative
path inside the directory that named it, reaching a regular file without crossing a symlink. That
is checked before any byte of the named file is read, and the file is then opened with
``O_NOFOLLOW``, so a symlink swapped in between is refused too.

Symlinks are allowed only where a layout uses them on purpose, and only inside a root the caller
names: a Hugging Face cache snapshot points into its own ``blobs/`` (``allow_links_within`` = the
repository's cache directory), ``checkpoints/last`` points at a sibling step directory (checked by
:mod:`lerobot_ckpt.discovery`).

Writes never follow a symlink they did not create: :func:`create_exclusive` opens its file with
``O_CREAT | O_EXCL | O_NOFOLLOW``, so a name planted in advance (a symlink, a file, a directory)
makes it fail instead of writing through it. Standard library only: the torch-free converter uses
it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from lerobot_ckpt.errors import CheckpointWriteError, UnsafeCheckpointError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_CHECKPOINT_FIX = "use a checkpoint as it was written"


class UnsafePathError(UnsafeCheckpointError):
    """A path read from a file that leads outside the directory that named it (or through a symlink,
    or to something that is not a regular file). Raised before the path is read."""

    def __init__(
        self, named_by: Path | str, entry: str, value: object, why: str, fix: str = _CHECKPOINT_FIX
    ) -> None:
        self.named_by = Path(named_by)
        self.entry = entry
        self.value = value
        super().__init__(
            f"{self.named_by}: {entry} = {str(value)[:200]!r} {why}; it was not read. A file may only name "
            f"a relative path without '..' that is a regular file inside its own directory: {fix}"
        )


def check_name(
    value: object, *, named_by: Path | str, entry: str, fix: str = _CHECKPOINT_FIX
) -> PurePosixPath:
    """``value`` as a relative POSIX path with no ``..``, no empty or absolute part (no I/O).

    Used where the file is only indexed now and read later, so a bad name is refused before
    anything else happens."""
    if not isinstance(value, str) or not value:
        raise UnsafePathError(named_by, entry, value, "is not a non-empty string", fix)
    if "\\" in value or any(ord(c) < 32 or ord(c) == 127 for c in value):  # a NUL, or a newline in a message
        raise UnsafePathError(
            named_by, entry, value, "holds a NUL byte, a control character or a backslash", fix
        )
    pure = PurePosixPath(value)
    if pure.is_absolute() or value.startswith("~"):
        raise UnsafePathError(named_by, entry, value, "is an absolute path", fix)
    parts = value.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafePathError(
            named_by, entry, value, "is not a plain relative path (it has '..', '.' or '//')"
        )
    return pure


def _link_ok(link: Path, root: Path | None) -> bool:
    if root is None:
        return False
    try:
        target = link.resolve(strict=True)
        return target.is_relative_to(root.resolve(strict=True))
    except (OSError, RuntimeError):
        return False


def resolve_inside(
    directory: Path | str,
    value: object,
    *,
    named_by: Path | str,
    entry: str,
    allow_links_within: Path | str | None = None,
    kind: str = "file",
    fix: str = _CHECKPOINT_FIX,
) -> Path:
    """``directory / value`` after checking the rule (see the module docstring); raises
    :class:`UnsafePathError` naming ``named_by`` and ``entry`` otherwise.

    ``kind`` is ``"file"`` (a regular file must exist there) or ``"dir"`` (a directory). A missing
    path is reported as missing in the same one-line form. ``allow_links_within``: a symlink on the
    way is accepted only when what it points at is inside this root."""
    pure = check_name(value, named_by=named_by, entry=entry, fix=fix)
    directory = Path(directory)
    root = Path(allow_links_within) if allow_links_within is not None else None
    current = directory
    for i, part in enumerate(pure.parts):
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            raise UnsafePathError(
                named_by, entry, value, f"names {current}, which does not exist", fix
            ) from None
        except OSError as exc:
            raise UnsafePathError(
                named_by, entry, value, f"names {current}, which cannot be read ({exc.strerror})", fix
            ) from None
        if stat.S_ISLNK(info.st_mode):
            if not _link_ok(current, root):
                raise UnsafePathError(
                    named_by, entry, value, f"is a symlink ({current} -> {os.readlink(current)})", fix
                )
            info = os.stat(current)
        last = i == len(pure.parts) - 1
        if not last and not stat.S_ISDIR(info.st_mode):
            raise UnsafePathError(
                named_by, entry, value, f"goes through {current}, which is not a directory", fix
            )
        if last:
            wanted = stat.S_ISDIR if kind == "dir" else stat.S_ISREG
            if not wanted(info.st_mode):
                what = "a directory" if kind == "dir" else "a regular file"
                raise UnsafePathError(named_by, entry, value, f"names {current}, which is not {what}", fix)
    resolved = current.resolve()
    base = directory.resolve()
    if not resolved.is_relative_to(base) and not (
        root is not None and resolved.is_relative_to(root.resolve())
    ):
        raise UnsafePathError(named_by, entry, value, f"resolves to {resolved}, outside {base}", fix)
    return current


def open_inside(
    directory: Path | str,
    value: object,
    *,
    named_by: Path | str,
    entry: str,
    allow_links_within: Path | str | None = None,
    buffering: int = -1,
) -> BinaryIO:
    """:func:`resolve_inside`, then the file opened for reading without following a symlink at its
    last component (a symlink swapped in after the check is refused, not read)."""
    path = resolve_inside(
        directory, value, named_by=named_by, entry=entry, allow_links_within=allow_links_within
    )
    flags = os.O_RDONLY | _CLOEXEC | (0 if allow_links_within is not None else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UnsafePathError(
            named_by, entry, value, f"could not be opened safely ({exc.strerror})"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(named_by, entry, value, f"names {path}, which is not a regular file")
    return os.fdopen(fd, "rb", buffering=buffering)


class LinkedLayoutError(UnsafePathError):
    """A fixed-name part of a checkpoint's layout (a step directory, ``pretrained_model/``,
    ``training_state/``, a shard directory, a file in them) that is a symlink: it could lead into
    another run, so it is neither read nor written through. Raised before anything is read."""

    def __init__(self, path: Path | str, what: str) -> None:
        path = Path(path)
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        self.named_by = path.parent
        self.entry = path.name
        self.value = target
        UnsafeCheckpointError.__init__(
            self,
            f"{path} is a symlink (to {target[:200]}); {what} is never followed through a symlink "
            "(it could lead into another run), so nothing was read or written: give the real path "
            "(the checkpoint as it was written, or a copy with the real files: cp -rL)",
        )


def layout_path(directory: Path | str, *names: str, what: str) -> Path:
    """``directory/names…``: fixed names of a checkpoint's layout below ``directory``, none of which
    may be a symlink (:class:`LinkedLayoutError`). ``directory`` itself is the caller's (a user's
    run directory may sit behind a symlink of their own). A missing name is not an error here:
    the caller reports it in its own words."""
    current = Path(directory)
    for name in names:
        current = current / name
        if current.is_symlink():
            raise LinkedLayoutError(current, what)
    return current


def refuse_links_below(directory: Path | str, what: str, *, depth: int = 1) -> None:
    """:class:`LinkedLayoutError` when ``directory`` or anything under it (``depth`` levels) is a
    symlink; a missing ``directory`` passes (the caller reports it). Dot-prefixed names are skipped:
    nothing reads a leftover temporary name, and a DCP ``.metadata`` is opened by its own reader
    without following a link (:func:`open_inside`)."""
    directory = Path(directory)
    if directory.is_symlink():
        raise LinkedLayoutError(directory, what)
    if depth <= 0 or not directory.is_dir():
        return
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_symlink():
                raise LinkedLayoutError(Path(entry.path), what)
            if depth > 1 and entry.is_dir(follow_symlinks=False):
                refuse_links_below(entry.path, what, depth=depth - 1)


def refuse_link(path: Path | str, what: str) -> None:
    """One line (:class:`CheckpointWriteError`) when ``path`` is a symlink: a destination or a
    directory to delete must be the thing itself, never a pointer somewhere else."""
    path = Path(path)
    if path.is_symlink():
        raise CheckpointWriteError(
            f"{path} is a symlink (to {os.readlink(path)}); {what} never goes through a symlink: "
            "give the real path",
            path=path,
        )


def create_exclusive(path: Path | str, mode: int = 0o644) -> BinaryIO:
    """A new file at ``path`` opened for writing: created exclusively, never through a symlink.

    ``FileExistsError`` when anything (a file, a directory, a symlink, dangling or not) already has
    the name; callers pick a fresh name or report it. The parent directory is the caller's (a
    staging directory it created, or the output directory it checked)."""
    fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    return os.fdopen(fd, "wb")
