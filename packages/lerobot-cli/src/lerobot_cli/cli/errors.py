"""The one error type the CLI turns into ``<prog>: error: <sentence>`` and exit code 2."""

from __future__ import annotations

import os
import sys
import time
from typing import NoReturn

from lerobot_cli.errors import ConfigError

PROG = "lerobot-train"
USAGE_EXIT_CODE = 2


class UsageError(ConfigError):
    """Bad flags, files or environment: the user can fix it; no traceback is shown. The command line's own
    :class:`ConfigError`: code outside ``lerobot_cli.cli`` (policies, optimizers) raises ``ConfigError``
    itself, and every place that turns a ``UsageError`` into its line catches ``ConfigError``."""


QUIET_EXIT_DELAY_S = 1.0


def is_quiet_rank() -> bool:
    """Under a launcher, before the processes have joined, every rank parses the same flags and reads
    the same files, so a usage error is found by all of them alike: the first process of each node
    prints it and the others leave silently (once per job on one node, once per node on several,
    never lost: a node whose first process passed prints nothing because nothing failed there)."""
    try:
        multi = int(os.environ.get("WORLD_SIZE", "1") or "1") > 1
    except ValueError:
        return False
    return multi and os.environ.get("LOCAL_RANK", "0").strip() not in ("", "0")


def leave_quietly(code: int = USAGE_EXIT_CODE) -> NoReturn:
    """Exit a beat after the printing rank, so the launcher does not kill it before its line is out."""
    time.sleep(QUIET_EXIT_DELAY_S)
    raise SystemExit(code)


def exit_usage(prog: str, message: str) -> NoReturn:
    if is_quiet_rank():
        leave_quietly()
    first, *rest = str(message).strip().splitlines() or [""]
    print(f"{prog}: error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line}", file=sys.stderr)
    sys.stdout.flush()
    raise SystemExit(USAGE_EXIT_CODE)
