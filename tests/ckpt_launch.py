"""Launch a script under ``torch.distributed.run`` with a hard timeout (checkpoint tests' own helper).

The whole process group (agent + workers) runs in its own session, so a hang is ended by killing
that session rather than leaving orphaned workers on a shared CI machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run ``script`` on ``nproc`` local CPU workers; raise AssertionError with the output on timeout."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "--max-restarts=0",
        str(script),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(
            f"torchrun did not finish within {timeout:.0f} s (a hang?):\n{out[-6000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)
