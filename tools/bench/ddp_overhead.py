"""DDP overhead: step time of a 2-process DDP run vs a 1-process run at equal per-rank batch.

Both runs are launched from this one invocation, back to back, with the same model, data,
per-rank batch and thread count (OMP_NUM_THREADS=1 per process), through the real engine and
loop (``lerobot_parallel`` + ``lerobot_trainloop``). The ratio t(2 procs) / t(1 proc) is the
price of gradient synchronisation (plus contention for shared cores: on a machine with fewer
free cores than processes it is not pure communication). Scaling efficiency is cluster
throughput over twice the single-process throughput.

    uv run python tools/bench/ddp_overhead.py [--steps 200] [--batch-size 32] [--hidden 512] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _memory_common import run_workers


def worker(args: argparse.Namespace) -> None:
    import torch
    from lerobot_parallel import (
        AcceleratorConfig,
        GradientAccumulationConfig,
        build_plan,
        parallel_session,
        wrap_model,
    )
    from lerobot_trainloop import TrainLoop
    from lerobot_trainloop.testing import TinyRegressor

    accel = AcceleratorConfig(
        mixed_precision=args.mixed_precision,
        gradient_accumulation=GradientAccumulationConfig(args.grad_accum),
    )
    with parallel_session(accelerator=accel, device=args.device) as rt:
        model = TinyRegressor(in_dim=args.hidden, hidden=args.hidden, out_dim=args.hidden)
        wrapped = wrap_model(model, rt, build_plan(model, rt, accel))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loop = TrainLoop(wrapped, opt, accelerator=accel)
        g = torch.Generator().manual_seed(rt.dp_rank)
        batches = [
            {
                "x": torch.randn(args.batch_size, args.hidden, generator=g),
                "y": torch.randn(args.batch_size, args.hidden, generator=g),
            }
            for _ in range(8)
        ]
        loop.run(batches, args.warmup)
        loop.metrics.reset()
        t0 = time.perf_counter()
        loop.run(batches, args.warmup + args.steps)
        wall = time.perf_counter() - t0
        reduced = loop.reduce_metrics()
        if rt.is_main:
            params = sum(p.numel() for p in model.parameters())
            Path(args.out).write_text(
                json.dumps(
                    {
                        "world_size": rt.world_size,
                        "wall_s": wall,
                        "step_s": wall / args.steps,
                        "samples_per_s": args.batch_size * rt.dp_world_size * args.steps / wall,
                        "loop_step_s_max": reduced["step_s"],
                        "params": params,
                    }
                )
            )


def launch(args: argparse.Namespace, nproc: int, out: Path) -> dict:
    me = [
        str(Path(__file__).resolve()),
        "--worker",
        "--out",
        str(out),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--batch-size",
        str(args.batch_size),
        "--hidden",
        str(args.hidden),
        "--device",
        args.device,
        "--mixed-precision",
        args.mixed_precision,
        "--grad-accum",
        str(args.grad_accum),
    ]
    return run_workers(me, None if nproc == 1 else nproc, out, args.timeout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per-rank micro-batch (equal in both runs)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--device", default="cpu", help="cpu, cuda, auto")
    p.add_argument("--mixed-precision", default="no", choices=("no", "bf16", "fp16"))
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        one = launch(args, 1, Path(tmp) / "one.json")
        many = launch(args, args.nproc, Path(tmp) / "many.json")
    ratio = many["step_s"] / one["step_s"]
    efficiency = many["samples_per_s"] / (args.nproc * one["samples_per_s"])
    print(
        f"model: {one['params']:,} params, per-rank batch {args.batch_size}, {args.steps} timed steps, "
        f"device {args.device}, precision {args.mixed_precision}, grad accum {args.grad_accum}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}"
    )
    print(f"1 proc : {one['step_s'] * 1e3:8.2f} ms/step  {one['samples_per_s']:10.1f} samples/s")
    print(
        f"{args.nproc} procs: {many['step_s'] * 1e3:8.2f} ms/step  "
        f"{many['samples_per_s']:10.1f} samples/s (cluster)"
    )
    print(f"step-time ratio {args.nproc}-proc / 1-proc: {ratio:.3f}   scaling efficiency: {efficiency:.3f}")
    print(json.dumps({"one": one, "many": many, "ratio": ratio, "efficiency": efficiency}))


if __name__ == "__main__":
    main()
