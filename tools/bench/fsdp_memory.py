"""Per-rank memory of ACT at its default size: DDP vs FSDP2 with dp_shard=2 and 4, measured.

All three jobs are launched from this one invocation, one after the other, on real processes
(torchrun, CPU/gloo by default) through the real engine (``lerobot_parallel.wrap_model``). Each
rank builds ACT with LeRobot's default hyper-parameters (ResNet-18 backbone, dim 512, 4+1
transformer layers, 4 VAE-encoder layers; the image size only changes activations, so a small
one keeps the step cheap), runs one AdamW training step and then counts the bytes it holds in
parameter, gradient and optimizer-state storages (``lerobot_parallel.memory.measure_rank_bytes``).
The largest rank is reported, with the ratio to DDP (target ≤ 1.05/N) and the plan's estimate.

    uv run python tools/bench/fsdp_memory.py [--device cpu] [--image-size 96]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _memory_common import STATE_HEADER, above_target, largest_rank, plan_memory, run_workers, state_columns


def _act(image_size: int):
    from lerobot_cli.features import PolicyFeature
    from lerobot_cli.policies.act.config import ACTConfig
    from lerobot_cli.policies.act.modeling import ACTPolicy

    cfg = ACTConfig(
        input_features={
            "observation.state": PolicyFeature("STATE", (14,)),
            "observation.images.top": PolicyFeature("VISUAL", (3, image_size, image_size)),
        },
        output_features={"action": PolicyFeature("ACTION", (14,))},
        pretrained_backbone_weights=None,
    )
    return cfg, ACTPolicy(cfg)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from lerobot_parallel import ParallelismConfig, build_plan, parallel_session, wrap_model
    from lerobot_parallel.memory import measure_rank_bytes

    parallelism = ParallelismConfig(dp_shard=args.dp_shard)
    with parallel_session(parallelism, device=args.device) as rt:
        torch.manual_seed(0)
        cfg, policy = _act(args.image_size)
        plan = build_plan(policy, rt, default_wrap_modules=type(policy)._fsdp_wrap_modules)
        model = wrap_model(policy, rt, plan).model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=1e-4)
        g = torch.Generator().manual_seed(rt.dp_rank)
        batch = {
            "observation.state": torch.randn(1, 14, generator=g),
            "observation.images.top": torch.rand(1, 3, args.image_size, args.image_size, generator=g),
            "action": torch.randn(1, cfg.chunk_size, 14, generator=g),
            "action_is_pad": torch.zeros(1, cfg.chunk_size, dtype=torch.bool),
        }
        batch = {k: v.to(rt.device) for k, v in batch.items()}
        loss, _ = model(batch)
        loss.backward()
        opt.step()  # gradients stay: a training step holds params + grads + optimizer state at once
        mine = measure_rank_bytes(model, opt)
        every = [None] * rt.world_size
        dist.all_gather_object(every, mine)
        if rt.is_main:
            Path(args.out).write_text(
                json.dumps(
                    {
                        "mode": rt.mode,
                        "world_size": rt.world_size,
                        "ranks": every,
                        "params": sum(p.numel() for p in policy.parameters()) if rt.mode == "ddp" else None,
                        "estimate": plan_memory(plan.memory),
                        "units": len(plan.units),
                        "loss": float(loss.detach()),
                    }
                )
            )


def launch(args: argparse.Namespace, nproc: int, dp_shard: int, out: Path) -> dict:
    me = [
        str(Path(__file__).resolve()),
        "--worker",
        "--out",
        str(out),
        "--dp-shard",
        str(dp_shard),
        "--device",
        args.device,
        "--image-size",
        str(args.image_size),
    ]
    return run_workers(me, nproc, out, args.timeout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, auto")
    p.add_argument("--image-size", type=int, default=96)
    p.add_argument("--shards", type=int, nargs="+", default=[2, 4])
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--dp-shard", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"DDP (2 procs)": launch(args, 2, 1, Path(tmp) / "ddp.json")}
        for n in args.shards:
            runs[f"FSDP dp_shard={n}"] = launch(args, n, n, Path(tmp) / f"fsdp{n}.json")
    ddp = max(r["total"] for r in runs["DDP (2 procs)"]["ranks"])
    print(
        f"ACT default size: {runs['DDP (2 procs)']['params']:,} parameters, AdamW, device {args.device}, "
        f"image {args.image_size}x{args.image_size}; largest rank after one step "
        "(params + grads + optimizer state)"
    )
    print(f"{'topology':<18} {STATE_HEADER}")
    summary = {}
    for name, run in runs.items():
        top, n, ratio, target = largest_rank(run, ddp)
        summary[name] = {
            "ratio": ratio,
            "target": target,
            "bytes": top,
            "estimate": run["estimate"],
            "units": run["units"],
        }
        print(
            f"{name:<18} {state_columns(top, ratio, target, run['estimate'])}{above_target(n, ratio, target)}"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
