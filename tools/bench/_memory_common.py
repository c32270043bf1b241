"""What the multi-process bench scripts share: launching a script's workers on real processes (torchrun),
the plan's memory estimate as a dict, and the per-rank memory table's columns.

The scripts import it as a sibling (``python tools/bench/X.py`` puts tools/bench/ first on ``sys.path``, for
the launcher and for the workers torchrun starts alike); it imports nothing heavy at import time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

# the per-rank state columns: parameters, gradients and optimizer state, their total, its ratio to DDP's
# largest rank, the target 1.05/N and the plan's estimate of the total
STATE_HEADER = (
    f"{'params':>13} {'grads':>13} {'optimizer':>13} {'total':>13} {'ratio':>7} {'target':>7} "
    f"{'estimate':>13}"
)
ESTIMATE_HEADER = f"{'params':>11} {'grads':>11} {'optimizer':>11} {'total':>11}"  # a plan's rows, in GiB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(argv: list[str], nproc: int | None, out: Path, timeout: float) -> dict:
    """Run ``python *argv`` (a bench script and its worker flags) on ``nproc`` processes through torchrun, or
    as one plain process when ``nproc`` is None, with OMP_NUM_THREADS=1 unless set and no inherited
    torchrun variables; returns the JSON its main rank wrote to ``out``."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if nproc is None:
        cmd = [sys.executable, *argv]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            f"--master-port={free_port()}",
            *argv,
        ]
    subprocess.run(cmd, env=env, check=True, timeout=timeout, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def plan_memory(memory) -> dict:
    """A plan's ``memory`` (``lerobot_parallel``'s estimate of one rank) as the bench scripts record it."""
    return {
        "params": memory.params,
        "grads": memory.grads,
        "optimizer": memory.optimizer,
        "total": memory.total,
    }


def largest_rank(run: dict, ddp_total: int) -> tuple[dict, int, float, float]:
    """A run's rank holding the most (params + grads + optimizer state), its shard count N (1 for DDP), the
    ratio of that rank's total to ``ddp_total`` (DDP's largest rank) and the target 1.05/N."""
    top = max(run["ranks"], key=lambda r: r["total"])
    n = 1 if run["mode"] == "ddp" else run["world_size"]
    return top, n, top["total"] / ddp_total, 1.05 / n


def state_columns(top: dict, ratio: float, target: float, estimate: dict) -> str:
    """The STATE_HEADER columns of one row."""
    return (
        f"{mib(top['params'])} {mib(top['grads'])} {mib(top['optimizer'])} {mib(top['total'])} {ratio:7.4f} "
        f"{target:7.4f} {mib(estimate['total'])}"
    )


def estimate_columns(m: dict) -> str:
    """The ESTIMATE_HEADER columns of one row."""
    return f"{gib(m['params'])} {gib(m['grads'])} {gib(m['optimizer'])} {gib(m['total'])}"


def above_target(n: int, ratio: float, target: float) -> str:
    return "" if n == 1 or ratio <= target else "  ABOVE TARGET"


def mib(n: int) -> str:
    return f"{n / 2**20:9.1f} MiB"


def gib(n: int) -> str:
    return f"{n / 2**30:7.2f} GiB"
