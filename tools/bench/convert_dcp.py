"""``lerobot-convert-dcp`` vs accelerate's ``merge_fsdp_weights`` on one synthetic DCP checkpoint.

Builds a ~2 GB DCP model checkpoint (``{"model": state_dict}`` in ``pytorch_model_fsdp_0/``, written
by ``torch.distributed.checkpoint`` in one process from a plain state dict), then merges it with
both tools, each in its own fresh process, alternating (ours, accelerate, ours, …; the shards are
read once beforehand so both start from the same page cache), and prints the best wall time and
the peak RSS of each side by side (the child's own ``VmHWM``: ``ru_maxrss`` would also count the
parent's pages the child held between ``fork`` and ``exec``). Each tool's
import-only RSS is measured too, and "held" (peak above imports) shows what the merge itself holds.
A CUDA build of torch alone is ~0.6 GB resident: ``lerobot-convert-dcp`` without ``--dtype``
imports no torch at all (the process checks ``sys.modules`` and the bench fails if it did), so its
peak RSS is the whole story; accelerate's and the ``--dtype`` run's include torch (for the cast
run torch is imported before the baseline, so "held" is the cast buffers). Outputs are compared
bitwise.

Targets (issue 7): time ≤ 1.0× accelerate's; peak RSS ≤ 1.5 × the largest tensor + 300 MB.
Our converter also fsyncs its output (accelerate's does not), which is inside its wall time.

    uv run python tools/bench/convert_dcp.py [--size-gb 2.0] [--largest-mb 256] [--dir /tmp] [--keep]

Needs about 3 × size free (shards + two outputs); with less, the size shrinks to fit (and says so).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 1_000_000
BUILD = r"""
import sys, torch, torch.distributed.checkpoint as dcp
size, largest, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
state, total, i = {}, 0, 0
sizes = [largest] + [largest // d for d in (2, 4, 8)] * 1000
while total < size:
    n = min(sizes[i], size - total) // 4
    rows = max(1, n // 1024)
    state[f"layers.{i}.weight"] = torch.empty(rows, n // rows).fill_(0.001 * i)
    total += state[f"layers.{i}.weight"].numel() * 4
    i += 1
state["norm.steps"] = torch.arange(7, dtype=torch.int64)
dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(out), no_dist=True)
print(len(state), total, max(t.numel() * t.element_size() for t in state.values()))
"""
# Each tool runs in a fresh process that, once its imports are done, resets the kernel's peak-RSS
# counter (/proc/self/clear_refs) and times the merge alone: "held" = VmHWM - VmRSS after imports.
WRAP = r"""
import sys, time
from pathlib import Path
def status(field):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024
if sys.argv[1] == "ours":
    from lerobot_ckpt.convert.cli import main
    import lerobot_ckpt.convert.merge, rich.progress
    if sys.argv[3:]:
        import torch  # a --dtype cast computes with torch: imported before the baseline
    run = lambda: main(["--checkpoint_dir=" + sys.argv[2], "--overwrite=true", *sys.argv[3:]])
else:
    from accelerate.utils import merge_fsdp_weights
    import torch.distributed.checkpoint.format_utils
    run = lambda: merge_fsdp_weights(sys.argv[2], sys.argv[3])
rss, imports_peak = status("VmRSS"), status("VmHWM")
Path("/proc/self/clear_refs").write_text("5")
t0 = time.perf_counter()
assert run() in (None, 0)
elapsed = time.perf_counter() - t0
assert sys.argv[1] != "ours" or sys.argv[3:] or "torch" not in sys.modules, "the plain merge imported torch"
print("RESULT", elapsed, status("VmHWM") - rss, rss, max(imports_peak, status("VmHWM")))
"""
COMPARE = r"""
import sys, torch
from safetensors import safe_open
with safe_open(sys.argv[1], "pt") as a, safe_open(sys.argv[2], "pt") as b:
    names = sorted(a.keys())
    assert names == sorted(b.keys()), "different tensor names"
    for n in names:
        x, y = a.get_tensor(n), b.get_tensor(n)
        assert x.dtype == y.dtype and torch.equal(x, y), n
print(len(names))
"""


def measure(cmd: list[str]) -> tuple[float, str]:
    """Wall seconds of that one child process and its stdout+stderr (its own peak RSS is in there)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    out = proc.stdout.read().decode(errors="replace")
    _, status = os.waitpid(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{cmd[:2]} failed ({proc.returncode}):\n{out[-3000:]}")
    return wall, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--largest-mb", type=float, default=256)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the synthetic checkpoint is written")
    ap.add_argument("--repeat", type=int, default=2, help="runs per tool (alternating); the best time counts")
    ap.add_argument("--keep", action="store_true", help="keep the files (default: removed)")
    args = ap.parse_args()

    base = Path(args.dir)
    free = shutil.disk_usage(base).free
    size = int(args.size_gb * 1e9)
    if 3 * size + 500 * MB > free:
        size = int((free - 500 * MB) / 3)
        if size < 100 * MB:
            sys.exit(f"only {free / 1e9:.2f} GB free in {base}: not enough for a meaningful run")
        print(f"note: {free / 1e9:.1f} GB free in {base}; shrinking the checkpoint to {size / 1e9:.2f} GB")
    largest = int(min(args.largest_mb * MB, size))
    work = Path(tempfile.mkdtemp(prefix="bench-convert-dcp-", dir=base))
    try:
        pretrained = work / "step" / "pretrained_model"
        shards = pretrained / "pytorch_model_fsdp_0"
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", BUILD, str(size), str(largest), str(shards)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        n_tensors, total, biggest = map(int, out[-3:])
        print(
            f"synthetic DCP checkpoint: {n_tensors} tensors, {total / 1e9:.2f} GB, largest "
            f"{biggest / MB:.0f} MB, {len(list(shards.glob('*.distcp')))} shard file(s), built in "
            f"{time.perf_counter() - t0:.1f} s"
        )

        for f in shards.iterdir():  # same page-cache state for both tools
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass
        runs: dict[str, list[tuple[float, float, float, float, float]]] = {
            "ours": [],
            "accelerate": [],
            "bf16": [],
        }
        commands = {
            "ours": [sys.executable, "-c", WRAP, "ours", str(pretrained)],
            "accelerate": [sys.executable, "-c", WRAP, "accelerate", str(shards), str(work / "accelerate")],
            "bf16": [sys.executable, "-c", WRAP, "ours", str(pretrained), "--dtype=bfloat16"],
        }
        for i in range(args.repeat):
            for name, cmd in commands.items():
                if name == "bf16" and i:
                    continue  # one cast run is enough to show what --dtype holds
                shutil.rmtree(work / "accelerate", ignore_errors=True)
                wall, out = measure(cmd)
                merge_s, held, imports, peak = map(float, out.split("RESULT")[-1].split()[:4])
                runs[name].append((wall, peak / MB, merge_s, held / MB, imports / MB))
        shutil.rmtree(work / "accelerate", ignore_errors=True)
        measure([sys.executable, "-c", WRAP, "accelerate", str(shards), str(work / "accelerate")])
        measure(commands["ours"])  # the bf16 run left a cast file; compare the as-stored one
        compared = subprocess.run(
            [
                sys.executable,
                "-c",
                COMPARE,
                str(pretrained / "model.safetensors"),
                str(work / "accelerate" / "model.safetensors"),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

        best = {n: min(r, key=lambda x: x[2]) for n, r in runs.items()}
        held = {n: max(x[3] for x in r) for n, r in runs.items()}
        rss_target = 1.5 * biggest / MB + 300
        print(
            f"\n{'':38}{'merge s':>8}  {'all runs':<16}{'process s':>10}{'peak RSS MB':>13}{'imports MB':>12}"
            f"{'held MB':>9}"
        )
        for name, label in (
            ("ours", "lerobot-convert-dcp"),
            ("accelerate", "accelerate merge_fsdp_weights"),
            ("bf16", "lerobot-convert-dcp --dtype=bfloat16"),
        ):
            wall, peak, merge_s, _, imports = best[name]
            every = " ".join(f"{x[2]:.1f}" for x in runs[name])
            print(
                f"{label:38}{merge_s:>8.1f}  {every:<16}{wall:>10.1f}{max(x[1] for x in runs[name]):>13.0f}"
                f"{imports:>12.0f}{held[name]:>9.0f}"
            )
        ratio = best["ours"][2] / best["accelerate"][2]
        print(f"\noutputs identical: {compared} tensors compared bitwise")
        print(
            f"time: ours/accelerate = {ratio:.2f} for the merge itself (target ≤ 1.00: "
            f"{'met' if ratio <= 1 else 'MISSED'}); ours fsyncs its output, accelerate does not"
        )
        peak = {n: max(x[1] for x in r) for n, r in runs.items()}
        print(
            f"memory: target 1.5 × {biggest / MB:.0f} MB + 300 MB = {rss_target:.0f} MB; ours peaks at "
            f"{peak['ours']:.0f} MB RSS for the whole process, torch never imported "
            f"({'met' if peak['ours'] <= rss_target else 'MISSED'}), of which the merge holds "
            f"{held['ours']:.0f} MB; accelerate peaks at {peak['accelerate']:.0f} MB "
            f"({peak['accelerate'] / peak['ours']:.1f}×) and holds {held['accelerate']:.0f} MB; "
            f"--dtype=bfloat16 (torch imported for the cast) peaks at {peak['bf16']:.0f} MB"
        )
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
