"""File-system primitives for crash-safe commits: fsync, atomic directory exchange, symlink swap.

A rename is only durable once the directory holding it is fsynced, and a file's bytes only once
the file is; so a commit fsyncs the whole staged tree, renames, then fsyncs the parent. Torch-free.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from lerobot_ckpt.errors import CheckpointWriteError
from lerobot_ckpt.paths import create_exclusive, refuse_link

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV}


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Persist a directory's entries (new names, renames); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (IsADirectoryError, PermissionError):  # platforms that refuse opening directories
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems (e.g. certain FUSE mounts) do not fsync directories
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Every regular file, then every directory bottom-up, so the tree is durable before its rename."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                fsync_file(path)
        fsync_dir(Path(dirpath))


def write_json(path: Path, obj: Any) -> None:
    """Create ``path`` exclusively, write, flush and fsync; JSON is small, so one write is the whole cost.

    Exclusive (:func:`~lerobot_ckpt.paths.create_exclusive`): every caller writes a new name (in a
    staging directory it made, or a :func:`staged_sibling`), so a name that already exists, above
    all a symlink planted in a checkpoint, raises ``FileExistsError`` instead of being written
    through."""
    with create_exclusive(path) as f:
        _write_json_to(f, obj)


def _write_json_to(f: BinaryIO, obj: Any) -> None:
    f.write((json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8"))
    f.flush()
    os.fsync(f.fileno())


def staged_sibling(path: Path, mode: int = 0o644) -> tuple[Path, BinaryIO]:
    """A new file next to ``path`` to be renamed over it: ``.<name>.tmp-<pid>-<random>``, made by
    ``mkstemp`` (``O_EXCL | O_NOFOLLOW``, a fresh random name until one is free).

    A fixed name (``.<name>.tmp-<pid>``) is not enough in a directory someone else wrote (a
    checkpoint one was sent): it can hold a symlink for every pid, and opening it would write
    through it. Returns the path and the file, open for writing in binary mode."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)
    try:
        os.fchmod(fd, mode)
    except OSError:  # a file system without permissions (e.g. some FUSE mounts): the default is fine
        pass
    return Path(name), os.fdopen(fd, "wb")


def replace_json(path: Path, obj: Any) -> None:
    """Replace ``path`` with ``obj`` as JSON in one atomic step: a :func:`staged_sibling`, fsynced,
    renamed over it, the directory fsynced; a crash leaves the old or the new file, never half of one.

    The rename replaces the name itself (never a symlink's target); a ``path`` that is a symlink or
    a directory is refused in one line before anything is written."""
    refuse_link(path, "rewriting a checkpoint file")
    if path.is_dir():
        raise CheckpointWriteError(f"{path} is a directory, not a file: it cannot be rewritten", path=path)
    tmp, f = staged_sibling(path)
    try:
        with f:
            _write_json_to(f, obj)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False where the kernel, libc or file system cannot (then the caller falls back to a
    two-step rename). This is what lets a save replace an existing step directory while ``last``
    keeps pointing at a complete checkpoint at every instant.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, TypeError):  # no libc handle, or a libc without renameat2
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def swap_symlink(link: Path, target: str, staging_name: str) -> None:
    """Point ``link`` at ``target`` (relative) in one atomic step: make a new link, rename over."""
    tmp = link.parent / staging_name
    if tmp.is_symlink() or tmp.exists():
        remove_path(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)


def remove_path(path: Path) -> None:
    """Remove a file, a symlink (never its target) or a whole tree; raises on failure."""
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


def remove_quietly(path: Path) -> None:
    """Best-effort cleanup of transient paths; a leftover is harmless and retried next save."""
    try:
        remove_path(path)
    except OSError:
        pass
