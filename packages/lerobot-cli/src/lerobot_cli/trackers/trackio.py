"""Optional experiment tracking with trackio (local-first: a SQLite file under $TRACKIO_DIR).

Only the main rank logs, and only metrics already reduced over ranks (at log steps, the only steps
whose numbers are read from the device; peak memory, ``gpu_mem_gb`` / ``peak_rss_gb``, is the max over
ranks), so a dashboard shows the same numbers as the console and ``metrics.jsonl``. trackio is an optional
extra; asking for it without it installed is a usage error caught before training starts.
"""

from __future__ import annotations

import contextlib
import io
import math
import sys
from typing import Any, TextIO

INSTALL_HINT = (
    "pip install 'lerobot-cli[trackio]' (in this repository: uv sync --all-packages --extra trackio)"
)


def trackio_available() -> bool:
    try:
        import trackio  # noqa: F401
    except ImportError:
        return False
    return True


def missing_trackio_message() -> str:
    return f"--trackio.enable=true needs the trackio package, which is not installed: {INSTALL_HINT}"


class TrackioTracker:
    def __init__(self, project: str, run_name: str | None, config: dict[str, Any]) -> None:
        import trackio

        self._trackio = trackio
        self.run = trackio.init(
            project=project, name=run_name, config=config, embed=False, auto_log_cpu=False, auto_log_gpu=False
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._trackio.log({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def finish(self) -> None:
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
