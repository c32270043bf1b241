"""Per-rank memory and step time of pi0: DDP vs FSDP2 with dp_shard=2 and 4, measured and estimated.

Two kinds of numbers, labelled as such in the output:

* **measured** — real processes launched from this one invocation, one topology after the other
  (torchrun, CPU/gloo by default, OMP_NUM_THREADS=1 per rank), through the real engine
  (``lerobot_parallel.build_plan`` + ``wrap_model``, so pi0's grouped joint-layer units are what
  FSDP2 shards). Each rank builds the same seeded pi0, runs one AdamW training step and counts the
  bytes it then holds in parameter, gradient and optimizer-state storages
  (``lerobot_parallel.memory.measure_rank_bytes``); the largest rank is reported with its ratio to
  DDP (target ≤ 1.05/N) and the plan's estimate. Then ``--timed-steps`` more steps are timed (the
  slowest rank's wall time per step, median): one FSDP2 step vs one DDP step at the same per-rank
  batch. The measured model is a *small* pi0 (``--measured`` size, default ``bench_250m``: 253 M
  values, 121 M trainable; PaliGemma's 257,152-token vocabulary makes its embedding and the two unused
  ``lm_head``\\ s most of it) with the same layer structure as LeRobot's: 18 joint PaliGemma/expert
  layer pairs, a 12-layer SigLIP. Its Gemma/SigLIP sizes are not variants the CLI offers; this script
  registers them in ``lerobot_cli.policies.common.paligemma.variants`` in its own processes only.
* **estimated** — a mid-size pi0 of about 1 B parameters (``--estimated`` sizes, default LeRobot's
  gemma_300m language model *and* gemma_300m expert with LeRobot's so400m SigLIP: 1,829,772,048
  values, 1,288,442,640 trainable), built on the meta device and planned with ``build_plan`` on
  ``ParallelRuntime.preview`` for each topology, exactly what ``--dry_run=true`` prints. It is not run:
  a real fp32 DDP rank of it with AdamW holds ~21 GiB (params + grads + 2 states), more than a
  24 GiB CPU machine has for two ranks. The measured rows check the estimator the estimated rows use
  (they agree to the byte at the measured size).

Transient memory (a unit's all-gathered parameters, activations) is in neither number. On CPU the
step times are gloo's: FSDP2 all-gathers every unit in forward and again in backward and
reduce-scatters its gradients, over loopback TCP, where DDP all-reduces gradient buckets once, so
FSDP2 is slower there; with fewer cores than processes they also include contention (4 ranks on 2
cores: half a core each), so compare dp_shard=2 with DDP (both 2 processes). On GPUs run it with
``--device cuda`` (nccl).

    uv run python tools/bench/pi0_memory.py [--device cpu] [--image-size 112] [--batch-size 2]
                                            [--timed-steps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _memory_common import (
    ESTIMATE_HEADER,
    STATE_HEADER,
    above_target,
    estimate_columns,
    largest_rank,
    plan_memory,
    run_workers,
    state_columns,
)

# (paligemma_variant, action_expert_variant, vision_variant); bench_250m is registered by this script.
SIZES = {
    "bench_250m": ("bench_250m", "bench_250m", "bench_250m"),
    "1b": ("gemma_300m", "gemma_300m", "so400m"),
    "1b_tiny_vision": ("gemma_300m", "gemma_300m", "tiny"),
}
STATE_DIM = ACTION_DIM = 6
TOKENS = 16


def _register_bench_variants() -> None:
    """bench_250m: Gemma with every pi0 variant's head layout (8 query heads, 1 key/value head) and
    LeRobot's 18 layers at width 256; a ViT-S-like 12-layer SigLIP. In this process only."""
    from lerobot_cli.policies.common.paligemma import variants

    variants.GEMMA_VARIANTS.setdefault(
        "bench_250m",
        variants.GemmaVariant(width=256, depth=18, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=32),
    )
    variants.VISION_VARIANTS.setdefault(
        "bench_250m",
        variants.VisionVariant(hidden_size=384, depth=12, num_heads=6, intermediate_size=1536, patch_size=14),
    )


def _config(size: str, image_size: int, chunk: int):
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies.pi0.config import PI0Config

    _register_bench_variants()
    vlm, expert, vision = SIZES[size]
    return PI0Config(
        paligemma_variant=vlm,
        action_expert_variant=expert,
        vision_variant=vision,
        image_resolution=(image_size, image_size),
        chunk_size=chunk,
        n_action_steps=chunk,
        tokenizer_max_length=TOKENS,
        input_features={
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, image_size, image_size)),
            "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
    )


def _batch(cfg, batch_size: int, rank: int, step: int, device):
    import torch

    g = torch.Generator().manual_seed(1000 * rank + step)
    size = cfg.image_resolution[0]
    batch = {
        "observation.images.top": torch.rand(batch_size, 3, size, size, generator=g),
        "observation.state": torch.randn(batch_size, STATE_DIM, generator=g),
        "action": torch.randn(batch_size, cfg.chunk_size, ACTION_DIM, generator=g),
        "observation.language.tokens": torch.randint(4, 260, (batch_size, TOKENS), generator=g),
        "observation.language.attention_mask": torch.ones(batch_size, TOKENS, dtype=torch.bool),
    }
    return {k: v.to(device) for k, v in batch.items()}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from lerobot_cli.policies.pi0.modeling import PI0Policy
    from lerobot_parallel import ParallelismConfig, build_plan, parallel_session, wrap_model
    from lerobot_parallel.memory import measure_rank_bytes

    with parallel_session(ParallelismConfig(dp_shard=args.dp_shard), device=args.device) as rt:
        torch.manual_seed(0)
        cfg = _config(args.measured, args.image_size, args.chunk_size)
        policy = PI0Policy(cfg).train()
        total = sum(p.numel() for p in policy.parameters())
        trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        plan = build_plan(policy, rt)
        model = wrap_model(policy, rt, plan).model
        opt = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=1e-5, weight_decay=1e-2
        )

        def step(i: int) -> float:
            batch = _batch(cfg, args.batch_size, rt.dp_rank, i, rt.device)
            dist.barrier()
            start = time.perf_counter()
            loss, _ = model(batch)
            loss.backward()
            opt.step()
            if rt.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when the slowest rank's does
            return float(elapsed)

        first = step(0)  # gradients stay: a training step holds params + grads + optimizer state at once
        mine = measure_rank_bytes(model, opt)
        times = []
        for i in range(1, 1 + args.timed_steps):
            opt.zero_grad(set_to_none=False)
            times.append(step(i))
        every = [None] * rt.world_size
        dist.all_gather_object(every, mine)
        if rt.is_main:
            Path(args.out).write_text(
                json.dumps(
                    {
                        "mode": rt.mode,
                        "world_size": rt.world_size,
                        "ranks": every,
                        "params": total,
                        "trainable": trainable,
                        "units": len(plan.units),
                        "first_step_s": first,
                        "step_s": times,
                        "grouped": [u.label for u in plan.units if u.members][:1],
                        "estimate": plan_memory(plan.memory),
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
        "--batch-size",
        str(args.batch_size),
        "--chunk-size",
        str(args.chunk_size),
        "--timed-steps",
        str(args.timed_steps),
        "--measured",
        args.measured,
    ]
    return run_workers(me, nproc, out, args.timeout)


def estimate(size: str, shards: list[int]) -> dict:
    """build_plan on ParallelRuntime.preview for DDP x2 and each dp_shard, the policy on the meta device."""
    import torch
    from lerobot_cli.policies.pi0.modeling import PI0Policy
    from lerobot_parallel import ParallelismConfig, build_plan
    from lerobot_parallel.runtime import ParallelRuntime

    with torch.device("meta"):
        policy = PI0Policy(_config(size, 224, 50))
    out = {
        "params": sum(p.numel() for p in policy.parameters()),
        "trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad),
        "plans": {},
    }
    for name, world, shard in (("DDP (2 procs)", 2, 1), *((f"FSDP dp_shard={n}", n, n) for n in shards)):
        plan = build_plan(policy, ParallelRuntime.preview(ParallelismConfig(dp_shard=shard).resolve(world)))
        out["plans"][name] = {**plan_memory(plan.memory), "units": len(plan.units)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, auto")
    p.add_argument(
        "--image-size", type=int, default=112, help="camera and SigLIP input size (multiple of 14)"
    )
    p.add_argument("--batch-size", type=int, default=2, help="per rank")
    p.add_argument("--chunk-size", type=int, default=10)
    p.add_argument("--timed-steps", type=int, default=3)
    p.add_argument("--shards", type=int, nargs="+", default=[2, 4])
    p.add_argument("--measured", default="bench_250m", choices=sorted(SIZES))
    p.add_argument("--estimated", default="1b", choices=sorted(SIZES))
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--dp-shard", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"DDP (2 procs)": launch(args, 2, 1, Path(tmp) / "ddp.json")}
        for n in args.shards:
            runs[f"FSDP dp_shard={n}"] = launch(args, n, n, Path(tmp) / f"fsdp{n}.json")
    ddp_run = runs["DDP (2 procs)"]
    ddp = max(r["total"] for r in ddp_run["ranks"])
    ddp_step = statistics.median(ddp_run["step_s"])
    vlm, expert, vision = SIZES[args.measured]
    print(
        f"MEASURED: pi0 {args.measured} (paligemma {vlm}, expert {expert}, vision {vision}): "
        f"{ddp_run['params']:,} parameters, {ddp_run['trainable']:,} trainable; AdamW, fp32, device "
        f"{args.device}, image {args.image_size}x{args.image_size}, "
        f"batch {args.batch_size} per rank, chunk {args.chunk_size}"
    )
    print(
        "  largest rank after one step (params + grads + optimizer state); step = slowest rank's wall time, "
        f"median (min) of {args.timed_steps}"
    )
    print(f"  {'topology':<18} {STATE_HEADER} {'step':>17} {'vs DDP':>7}")
    summary: dict = {"measured": {}, "estimated": {}}
    for name, run in runs.items():
        top, n, ratio, target = largest_rank(run, ddp)
        step_s = statistics.median(run["step_s"])
        summary["measured"][name] = {
            "ratio": ratio,
            "target": target,
            "bytes": top,
            "estimate": run["estimate"],
            "units": run["units"],
            "step_s": run["step_s"],
            "procs": run["world_size"],
        }
        print(
            f"  {name:<18} {state_columns(top, ratio, target, run['estimate'])} "
            f"{step_s:7.3f}s ({min(run['step_s']):6.3f}s) {step_s / ddp_step:6.2f}x"
            f"{above_target(n, ratio, target)}"
        )
    grouped = runs[f"FSDP dp_shard={args.shards[0]}"]["grouped"]
    print(
        f"  FSDP units: {runs[f'FSDP dp_shard={args.shards[0]}']['units']} + the root "
        f"(joint layers as grouped units, e.g. {grouped[0] if grouped else 'none'})"
    )

    est = estimate(args.estimated, args.shards)
    vlm, expert, vision = SIZES[args.estimated]
    ddp_est = est["plans"]["DDP (2 procs)"]["total"]
    print(
        f"ESTIMATED (build_plan on ParallelRuntime.preview, meta device; not run): pi0 {args.estimated} "
        f"(paligemma {vlm}, expert {expert}, vision {vision}): {est['params']:,} parameters, "
        f"{est['trainable']:,} trainable; AdamW, fp32"
    )
    print(f"  {'topology':<18} {ESTIMATE_HEADER} {'ratio':>7} {'target':>7}")
    for name, m in est["plans"].items():
        n = 1 if name.startswith("DDP") else int(name.rsplit("=", 1)[1])
        ratio = m["total"] / ddp_est
        summary["estimated"][name] = {"ratio": ratio, "target": 1.05 / n, **m}
        print(f"  {name:<18} {estimate_columns(m)} {ratio:7.4f} {1.05 / n:7.4f}")
    print(f"(wall time {time.perf_counter() - started:.0f} s)")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
