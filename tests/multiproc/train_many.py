"""Several ``lerobot-train`` runs, one after another, in one launch (one process per rank).

argv: the runs' flags, each run's flags ended by ``--then`` (the last one may omit it). Each run is
``lerobot_cli.train.main(flags)``, the console script's own entry point; it opens and tears down its
own process group (``parallel_session``; a second group in a process gets its own store prefix), so
runs share only the interpreter: the launch's start-up (torchrun, imports) is paid once, not per run.
Before each run rank 0 prints ``RUN_MARKER <i> ===`` on stdout and stderr, so the test can split both per run
(``launch.lerobot_train_runs``). A run that returns non-zero ends the launch with its code. An item
``@tree_digest <root> <json>`` (``launch.TreeDigest``) is no run: rank 0 writes ``launch.tree_digest(root)``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/, for launch.py
from _common import arm_watchdog, write_json
from launch import TREE_DIGEST, tree_digest

arm_watchdog(float(os.environ.get("TRAIN_MANY_WATCHDOG_S", "600")))

RUN_SEPARATOR = "--then"
RUN_MARKER = "=== train_many run"


def split_runs(argv: list[str]) -> list[list[str]]:
    runs, current = [], []
    for arg in argv:
        if arg == RUN_SEPARATOR:
            runs.append(current)
            current = []
        else:
            current.append(arg)
    if current:
        runs.append(current)
    return runs


def main() -> int:
    from lerobot_cli.train import main as lerobot_train

    i = 0
    for flags in split_runs(sys.argv[1:]):
        if flags[0] == TREE_DIGEST:  # launch.TreeDigest: rank 0 records a directory between two runs
            if int(os.environ.get("RANK", "0")) == 0:
                write_json(flags[2], tree_digest(flags[1]))
            continue
        if int(os.environ.get("RANK", "0")) == 0:
            sys.stderr.flush()
            print(f"{RUN_MARKER} {i} ===", flush=True)
            print(f"{RUN_MARKER} {i} ===", file=sys.stderr, flush=True)
        code = lerobot_train(flags)
        sys.stdout.flush()
        if code:
            return code
        i += 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
