"""Wall time of `lerobot-train --help` (target < 0.6 s) beside a bare `python -c pass`, same run.

Usage: uv run python tools/bench/help_latency.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def best_of(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    script = shutil.which("lerobot-train")
    if script is None:
        sys.exit("lerobot-train is not on PATH: run with `uv run`")
    base_min, base_med = best_of([sys.executable, "-c", "pass"], args.repeats)
    help_min, help_med = best_of([script, "--help"], args.repeats)
    act_min, act_med = best_of([script, "--policy.type=act", "--help"], args.repeats)
    print(f"python -c pass              min {base_min:.3f}s  median {base_med:.3f}s")
    print(f"lerobot-train --help        min {help_min:.3f}s  median {help_med:.3f}s  (target < 0.6 s)")
    print(f"... --policy.type=act --help min {act_min:.3f}s  median {act_med:.3f}s")
    print(f"ratio help / bare python: {help_med / base_med:.2f}x")


if __name__ == "__main__":
    main()
