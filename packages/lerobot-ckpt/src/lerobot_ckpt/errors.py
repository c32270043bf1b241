"""One error hierarchy, so a CLI can print a single line for anything the user can act on.

Every error derives from :class:`CheckpointError` (a ``ValueError``): a trainer catches that one
class, prints ``str(exc)`` and exits 2. Messages name the file and what is wrong with it, because
the person reading them is looking at a directory listing, not at our code. Loading raises before
anything is modified, so catching one of these leaves the model and optimizer as they were.
"""

from __future__ import annotations

from pathlib import Path


class CheckpointError(ValueError):
    """Root of every checkpoint problem a user can act on."""


class CheckpointConfigError(CheckpointError):
    """The caller asked for something inconsistent (e.g. an fp16 run without its loss scaler)."""


class CheckpointNotFoundError(CheckpointError):
    """A path given to resume from is not a checkpoint, or a run has no checkpoint yet."""


class MissingCheckpointFileError(CheckpointError):
    """A file or directory the checkpoint must hold is absent (an incomplete copy, a deleted file)."""

    def __init__(self, path: Path | str, why: str = "") -> None:
        self.path = Path(path)
        super().__init__(f"checkpoint file missing: {self.path}" + (f" ({why})" if why else ""))


class CorruptCheckpointError(CheckpointError):
    """A file exists but cannot be read back: truncated, not valid safetensors/JSON, wrong schema."""

    def __init__(self, path: Path | str, why: str) -> None:
        self.path = Path(path)
        super().__init__(f"checkpoint file is unreadable or corrupt: {self.path}: {why}")


class StateMismatchError(CheckpointError):
    """The checkpoint is intact but does not fit the objects it is being loaded into."""


class ModelMismatchError(StateMismatchError):
    """Weights whose keys or shapes differ from the model's (a different policy or config)."""


class OptimizerMismatchError(StateMismatchError):
    """Optimizer state whose groups/params differ from the optimizer being restored."""


class LegacyCheckpointError(CheckpointError):
    """A checkpoint written by LeRobot itself (≤ 0.6.x), whose training state we cannot resume."""


class UnsupportedCheckpointError(CheckpointError):
    """A checkpoint this version cannot load: a newer record format, or artifacts not readable here."""


class UnsafeCheckpointError(UnsupportedCheckpointError):
    """An entry whose unpickling could run code (a crafted or foreign record): never loaded."""


class OutputExistsError(CheckpointError):
    """A conversion would replace an existing file; the user has to ask for that (``--overwrite``)."""


class InsufficientDiskSpaceError(CheckpointError):
    """Checked before writing, so a conversion never dies half-way with the disk full."""


class CheckpointSaveError(CheckpointError):
    """A save failed; raised identically on every rank so that no rank waits for a dead peer."""


class CheckpointWriteError(CheckpointSaveError):
    """The file system refused a write (disk full, permissions, file-size limit).

    ``path`` is the file that failed; ``os_error`` the underlying error when this rank saw it
    (peers get the same message but no local exception).
    """

    def __init__(self, message: str, path: Path | str | None = None, os_error: BaseException | None = None):
        self.path = Path(path) if path is not None else None
        self.os_error = os_error
        super().__init__(message)
