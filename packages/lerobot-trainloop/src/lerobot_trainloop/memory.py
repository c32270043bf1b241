"""Peak memory of this process, as a metric read at log steps only.

On CUDA it is ``torch.cuda.max_memory_allocated`` (the caching allocator's own counter, read on the
host: no device sync), in GiB as LeRobot logs it (``gpu_mem_gb``). Elsewhere it is the peak resident
set size of the process (``getrusage(RUSAGE_SELF).ru_maxrss``: KiB on Linux, bytes on macOS), in GiB
(``peak_rss_gb``). Both are peaks since the process started, never reset, so a window's value is the
high-water mark so far; ranks reduce it by max (the rank closest to running out).
"""

from __future__ import annotations

import sys

import torch

GIB = 1024**3
GPU_MEM = "gpu_mem_gb"
PEAK_RSS = "peak_rss_gb"


def peak_memory(device: torch.device | str) -> tuple[str, float] | None:
    """``(metric name, GiB)`` of this process's peak memory on ``device``; None where unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return GPU_MEM, torch.cuda.max_memory_allocated(device) / GIB
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return PEAK_RSS, peak / GIB if sys.platform == "darwin" else peak * 1024 / GIB
