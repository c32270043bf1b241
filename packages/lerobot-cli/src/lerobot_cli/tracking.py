"""Optional experiment tracking with trackio (local-first: a SQLite file under $TRACKIO_DIR).

Only the main rank logs, and only metrics already reduced over ranks, so a dashboard shows the same
numbers as the console and ``metrics.jsonl``. trackio is an optional extra; asking for it without it
installed is a usage error caught before training starts.
"""

from __future__ import annotations

import math
from typing import Any

INSTALL_HINT = "pip install 'lerobot-cli[trackio]' (in this repository: uv sync --all-packages --extra trackio)"


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
        self.run = trackio.init(project=project, name=run_name, config=config, embed=False,
                                auto_log_cpu=False, auto_log_gpu=False)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._trackio.log({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def finish(self) -> None:
        self._trackio.finish()
