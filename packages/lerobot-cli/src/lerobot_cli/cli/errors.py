"""The one error type the CLI turns into ``<prog>: error: <sentence>`` and exit code 2."""

from __future__ import annotations

import sys
from typing import NoReturn

USAGE_EXIT_CODE = 2


class UsageError(ValueError):
    """Bad flags, files or environment: the user can fix it; no traceback is shown."""


def exit_usage(prog: str, message: str) -> NoReturn:
    first, *rest = str(message).strip().splitlines() or [""]
    print(f"{prog}: error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line}", file=sys.stderr)
    sys.stdout.flush()
    raise SystemExit(USAGE_EXIT_CODE)
