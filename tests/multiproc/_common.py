"""Shared by the scripts the multi-process tests launch (imported by path: scripts run as files)."""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path


def arm_watchdog(seconds: float = 60.0) -> None:
    """Dump every thread's stack and exit if this rank is still running after ``seconds``:
    a hung collective then fails the test with a traceback instead of only a timeout."""
    faulthandler.dump_traceback_later(seconds, exit=True)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def write_json(path: str | Path, payload: dict) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))
    tmp.replace(path)


def out_path(name: str) -> Path:
    """``<argv[1]>/<name>``: the test passes a tmp directory as the first argument."""
    return Path(sys.argv[1]) / name
