"""What the main rank shows and records: banner, progress bar (TTY) or plain lines, metrics JSONL.

Other ranks print nothing but errors; the metrics written here are already reduced over ranks,
so the file and the console describe the cluster, not rank 0 (``gpu_mem_gb`` / ``peak_rss_gb``: the
largest rank's peak). Only log steps carry numbers read from the device: the per-step progress update
takes the step and the lr (host values), so it never waits for the device; the bar shows the loss of
the last log step.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from lerobot_cli.filewrites import writing

METRICS_FILE = "metrics.jsonl"


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"


def format_log_line(step: int, total: int, metrics: dict[str, float]) -> str:
    order = [
        "loss",
        "lr",
        "grad_norm",
        "samples_per_s",
        "step_s",
        "data_s",
        "update_s",
        "gpu_mem_gb",
        "peak_rss_gb",
    ]
    keys = [k for k in order if k in metrics] + sorted(
        k for k in metrics if k not in order and k != "samples"
    )
    parts = [
        f"{k}={_fmt(metrics[k])}"
        for k in keys
        if not (isinstance(metrics[k], float) and math.isnan(metrics[k]))
    ]
    return f"step {step}/{total} " + " ".join(parts)


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


class Reporter:
    """Console and JSONL output of one run; a no-op on non-main ranks."""

    def __init__(
        self,
        enabled: bool,
        output_dir: Path,
        total_steps: int,
        start_step: int = 0,
        stream: TextIO | None = None,
        tracker: Any | None = None,
    ) -> None:
        self.enabled = enabled
        self.total = total_steps
        self.stream = stream or sys.stdout
        self.tracker = tracker
        self._progress = None
        self._task = None
        self._jsonl = None
        self._t0 = time.perf_counter()
        self._start = start_step
        self._metrics_path = output_dir / METRICS_FILE
        self._last_loss = ""  # the progress bar's loss: the last log step's
        if not enabled:
            return
        if self.stream.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, status="")
            self._progress.start()

    def print(self, text: str) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def step(self, step: int, lr: float | None) -> None:
        """Per-step progress: host values only (the loss is shown as of the last log step)."""
        if self._progress is not None:
            status = self._last_loss + (f" lr {_fmt(lr)}" if lr is not None else "")
            self._progress.update(self._task, completed=step, status=status.strip())

    def log(self, step: int, metrics: dict[str, float], records: dict[str, float] | None = None) -> None:
        """``metrics`` on the console line and in the records; ``records`` (a mixture's samples per
        dataset) in metrics.jsonl and the tracker only."""
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self._t0
        done = step - self._start
        eta = elapsed / done * (self.total - step) if done > 0 else math.nan
        self.print(
            format_log_line(step, self.total, metrics) + (f" eta={eta:.0f}s" if math.isfinite(eta) else "")
        )
        self._record(step, elapsed, {**metrics, **(records or {})})
        self._last_loss = f"loss {_fmt(metrics.get('loss', math.nan))}"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, status=self._last_loss)

    def log_eval(self, step: int, metrics: dict[str, float], samples: int, weights: str) -> None:
        """The held-out eval loss and its parts, as ``eval/<name>`` (console, metrics.jsonl, trackio)."""
        if not self.enabled:
            return
        named = {f"eval/{k}": v for k, v in metrics.items()}
        parts = " ".join(f"{k}={_fmt(v)}" for k, v in named.items())
        self.print(f"eval step {step}/{self.total} {parts} ({samples} held-out frames, {weights} weights)")
        self._record(step, time.perf_counter() - self._t0, named)

    def _record(self, step: int, elapsed: float, metrics: dict[str, float]) -> None:
        record = {
            "step": step,
            "time_s": round(elapsed, 4),
            **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()},
        }
        if self._jsonl is None:  # opened at the first record: a run that fails before it leaves no empty file
            self._metrics_path.parent.mkdir(parents=True, exist_ok=True)
            self._jsonl = _open_for_append(self._metrics_path)
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self.tracker is not None:
            self.tracker.log(metrics, step=step)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.finish()
            self.tracker = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
