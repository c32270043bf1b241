"""``metrics.jsonl`` in the run directory: the run's own record, always on, and what every test and tool
reads. One JSON object per log or eval step: ``step``, ``time_s``, the console's metrics (eval ones as
``eval/<name>``) and the extras (a mixture's ``samples/<repo_id>``); a non-finite value is ``null``."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import TextIO

from lerobot_cli.filewrites import writing
from lerobot_cli.trackers.base import Record

METRICS_FILE = "metrics.jsonl"

_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_for_append(path: Path) -> TextIO:
    """``metrics.jsonl`` opened for appending, never through a symlink (``O_NOFOLLOW``) and only when
    it is a regular file: the run-directory check refuses a planted link in one line first, this
    keeps one appearing later from being followed (the write then fails naming the file)."""
    with writing(path):
        fd = os.open(path, _APPEND, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "a", encoding="utf-8")


def record_line(record: Record) -> dict:
    prefix = "eval/" if record.kind == "eval" else ""
    values = {**{prefix + k: v for k, v in record.metrics.items()}, **record.extra}
    return {
        "step": record.step,
        "time_s": round(record.time_s, 4),
        **{k: (v if math.isfinite(v) else None) for k, v in values.items()},
    }


class MetricsFile:
    """Appends each record to ``<output_dir>/metrics.jsonl`` (opened at the first record: a run that fails
    before it leaves no empty file) and flushes it, so a crash loses nothing logged."""

    name = "metrics.jsonl"

    def __init__(self, output_dir: Path) -> None:
        self.path = Path(output_dir) / METRICS_FILE
        self._file: TextIO | None = None

    def log(self, record: Record) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = _open_for_append(self.path)
        self._file.write(json.dumps(record_line(record)) + "\n")
        self._file.flush()

    def checkpoint(self, directory: Path) -> None:
        pass

    def video(self, key: str, path: Path, step: int, fps: int) -> None:
        pass  # eval_info.json lists the videos

    def saved_config(self) -> dict:
        return {}

    def finish(self, failed: bool) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
