"""``--save_checkpoint_to_hub``: every committed checkpoint uploaded to ``--policy.repo_id``, as LeRobot does.

Each checkpoint directory goes to ``checkpoints/<step>/`` of the model repository (created when missing),
in one commit tagged with the step, so a run that crashed or timed out leaves recoverable checkpoints on
the Hub and ``--policy.pretrained_revision=<step>`` names one (LeRobot's layout and tags).

Unlike LeRobot, the upload runs on a thread of the main rank: training goes on meanwhile (the other ranks
would otherwise wait in their next collective for as long as an upload takes, past its timeout on a slow
link), and a failed upload is one warning line, not the end of the run: the checkpoint is still on disk.
Uploads happen in order, one at a time; the end of the run waits for those still queued.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path

CHECKPOINTS_IN_REPO = "checkpoints"


def checkpoint_files(directory: Path) -> list[Path]:
    """The regular files under ``directory`` (a checkpoint this run wrote), links skipped."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink())


def push_checkpoint(directory: Path, repo_id: str, *, private: bool | None = None) -> str:
    """Upload ``directory`` to ``checkpoints/<its name>/`` of ``repo_id`` in one commit tagged with its name;
    returns the path in the repository."""
    from huggingface_hub import CommitOperationAdd, HfApi

    directory = Path(directory)
    prefix = f"{CHECKPOINTS_IN_REPO}/{directory.name}"
    operations = [
        CommitOperationAdd(
            path_in_repo=f"{prefix}/{p.relative_to(directory).as_posix()}", path_or_fileobj=str(p)
        )
        for p in checkpoint_files(directory)
    ]
    api = HfApi()
    api.create_repo(repo_id=repo_id, private=private, exist_ok=True, repo_type="model")
    commit = api.create_commit(
        repo_id=repo_id,
        operations=operations,
        commit_message=f"checkpoint {directory.name}",
        repo_type="model",
    )
    api.create_tag(
        repo_id=repo_id,
        tag=directory.name,
        revision=getattr(commit, "oid", None),
        repo_type="model",
        exist_ok=True,
    )
    return prefix


class CheckpointUploader:
    """Uploads the checkpoints :meth:`submit` is given, in order, on a thread of its own; ``warn`` says a
    failure (one line, training goes on) and ``say`` a success. :meth:`close` waits for the queue."""

    def __init__(
        self,
        repo_id: str,
        *,
        private: bool | None,
        warn: Callable[[str], None],
        say: Callable[[str], None],
        push: Callable[..., str] = push_checkpoint,
    ) -> None:
        self.repo_id, self.private = repo_id, private
        self.warn, self.say, self.push = warn, say, push
        self.submitted: set[Path] = set()
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="checkpoint-upload", daemon=True)
        self._thread.start()

    def submit(self, directory: Path) -> None:
        """Queue a committed checkpoint (once: a path given twice is uploaded once)."""
        directory = Path(directory)
        if directory not in self.submitted:
            self.submitted.add(directory)
            self._queue.put(directory)

    def _run(self) -> None:
        while (directory := self._queue.get()) is not None:
            try:
                where = self.push(directory, self.repo_id, private=self.private)
                self.say(f"uploaded {directory} to {self.repo_id}/{where} (tag {directory.name})")
            except Exception as exc:  # noqa: BLE001 - any Hub or transport failure: one line, training goes on
                reason = str(exc).splitlines()[0] if str(exc) else ""
                self.warn(
                    f"uploading checkpoint {directory} to {self.repo_id} failed ({type(exc).__name__}: "
                    f"{reason}); it is on disk, and later checkpoints are still uploaded"
                )

    def close(self) -> None:
        """Wait for the queued uploads to end (the run's last checkpoint included)."""
        self._queue.put(None)
        self._thread.join()
