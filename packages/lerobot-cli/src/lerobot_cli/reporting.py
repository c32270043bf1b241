"""What the main rank shows and records: banner, progress bar (TTY) or plain lines, metrics JSONL.

Other ranks print nothing but errors; the metrics written here are already reduced over ranks,
so the file and the console describe the cluster, not rank 0 (``gpu_mem_gb`` / ``peak_rss_gb``: the
largest rank's peak). Only log steps carry numbers read from the device: the per-step progress update
takes the step and the lr (host values), so it never waits for the device; the bar shows the loss of
the last log step.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import TextIO

from lerobot_cli.trackers import METRICS_FILE, Record, Trackers

__all__ = ["METRICS_FILE", "Reporter", "format_log_line"]


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


SIM_EVAL_METRICS = ("pc_success", "avg_sum_reward", "avg_max_reward", "eval_s", "eval_ep_s")


class Reporter:
    """Console and JSONL output of one run; a no-op on non-main ranks."""

    def __init__(
        self,
        enabled: bool,
        output_dir: Path,
        total_steps: int,
        start_step: int = 0,
        stream: TextIO | None = None,
        trackers: Trackers | None = None,
    ) -> None:
        self.enabled = enabled
        self.total = total_steps
        self.stream = stream or sys.stdout
        # metrics.jsonl (and the trackers the run turned on): the main rank's only
        self.trackers = (trackers or Trackers.file_only(output_dir)) if enabled else None
        self._progress = None
        self._task = None
        self._t0 = time.perf_counter()
        self._start = start_step
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
        self._record(Record(step, elapsed, "train", metrics, records or {}))
        self._last_loss = f"loss {_fmt(metrics.get('loss', math.nan))}"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, status=self._last_loss)

    def log_eval(self, step: int, metrics: dict[str, float], samples: int, weights: str) -> None:
        """The held-out eval loss and its parts, as ``eval/<name>`` (console, metrics.jsonl, trackers)."""
        if not self.enabled:
            return
        named = {f"eval/{k}": v for k, v in metrics.items()}
        parts = " ".join(f"{k}={_fmt(v)}" for k, v in named.items())
        self.print(f"eval step {step}/{self.total} {parts} ({samples} held-out frames, {weights} weights)")
        self._record(Record(step, time.perf_counter() - self._t0, "eval", metrics))

    def log_sim_eval(self, step: int, overall: dict, weights: str) -> None:
        """A simulation eval's LeRobot metrics as ``eval/<name>`` (console, metrics.jsonl, trackers)."""
        if not self.enabled:
            return
        metrics = {k: float(overall[k]) for k in SIM_EVAL_METRICS}
        parts = " ".join(f"eval/{k}={_fmt(v)}" for k, v in metrics.items())
        self.print(
            f"sim eval step {step}/{self.total} {parts} ({overall['n_episodes']} episodes, {weights} weights)"
        )
        self._record(Record(step, time.perf_counter() - self._t0, "eval", metrics))

    def video(self, key: str, path: str | Path, step: int, fps: int) -> None:
        """A video for the trackers that keep one (wandb: LeRobot's ``eval/video``)."""
        if self.trackers is not None:
            self.trackers.video(key, Path(path), step, fps)

    def _record(self, record: Record) -> None:
        if self.trackers is not None:
            self.trackers.log(record)

    def checkpoint(self, directory: Path) -> None:
        """A committed checkpoint, for the trackers that keep one (wandb's artifacts)."""
        if self.trackers is not None:
            self.trackers.checkpoint(directory)

    def close(self, failed: bool = False) -> None:
        if self.trackers is not None:
            self.trackers.finish(failed)
            self.trackers = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
