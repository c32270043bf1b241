"""trackio (local-first: a SQLite file under ``$TRACKIO_DIR``): ``--trackio.enable=true``.

It gets the names ``metrics.jsonl`` uses (eval ones as ``eval/<name>``), so a dashboard and the file
read alike; non-finite values are left out (trackio stores floats only).
"""

from __future__ import annotations

import contextlib
import io
import math
import sys
from pathlib import Path
from typing import TextIO

from lerobot_cli.trackers.base import Record, RunContext


class TrackioTracker:
    name = "trackio"

    def __init__(self, project: str, run_name: str | None, config: dict) -> None:
        import trackio

        self._trackio = trackio
        self.run = trackio.init(
            project=project, name=run_name, config=config, embed=False, auto_log_cpu=False, auto_log_gpu=False
        )

    @classmethod
    def start(cls, ctx: RunContext) -> TrackioTracker:
        cfg = ctx.cfg
        return cls(cfg.trackio.project or cfg.job_name, cfg.job_name, ctx.config())

    def log(self, record: Record) -> None:
        prefix = "eval/" if record.kind == "eval" else ""
        values = {**{prefix + k: v for k, v in record.metrics.items()}, **record.extra}
        self._trackio.log({k: v for k, v in values.items() if math.isfinite(v)}, step=record.step)

    def checkpoint(self, directory: Path) -> None:
        pass

    def video(self, key: str, path: Path, step: int, fps: int) -> None:
        pass  # trackio keeps scalars here

    def saved_config(self) -> dict:
        return {}

    def finish(self, failed: bool = False) -> None:
        """End the run; whatever trackio prints meanwhile ("… (please wait...)") ends its line, so the
        next output, ours or the shell's, starts on a line of its own."""
        with _LineEnder(sys.stdout) as out, contextlib.redirect_stdout(out):
            self._trackio.finish()


class _LineEnder(io.TextIOBase):
    """A stdout pass-through that remembers whether the last write left a line open and, on exit,
    closes it with a newline (and flushes, so it comes out before a later stderr line)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream, self._open = stream, False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self._stream.write(text)
            self._open = not text.endswith("\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __exit__(self, *exc) -> None:
        if self._open:
            self._stream.write("\n")
        self._stream.flush()
