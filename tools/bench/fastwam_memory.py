"""Per-rank memory of FastWAM: FSDP2 x2 vs DDP x2 measured side by side, and the plan at full size on 8 GPUs.

Two kinds of numbers, labelled as such in the output:

* **measured**: real processes launched from this one invocation, one topology after the other (torchrun,
  CPU/gloo by default, OMP_NUM_THREADS=1 per rank), through the real engine (``lerobot_parallel.build_plan``
  with FastWAM's spec: its 30 ``MoTLayer`` units, each owning both experts' block i, then ``wrap_model``).
  Each rank builds the same seeded FastWAM with LeRobot's structure at a width this machine holds twice
  (``--layers`` MoT layers, 30 by default as LeRobot's; ``--heads`` heads of 128 channels, LeRobot's head
  geometry, for both experts' attention; the video expert ``heads x 128`` wide with a 4x FFN, the action
  expert half of that; 397 M parameters at the default 6 heads, whose DDP x2 peaks near 16 GiB for the two
  ranks, the most a 24 GiB machine leaves room for; 8 heads would be 705 M) and a tiny frozen Wan2.2 VAE
  (never in a unit, the optimizer or the counts), and runs two real training steps: ``FastWAMPolicy.forward``
  (LeRobot's video + action flow-matching loss on a short 64x64 two-camera video, the text context given
  as ``context`` / ``context_mask``, as when it is precomputed), backward and an AdamW step. It then counts
  the bytes it holds in parameter, gradient and optimizer-state storages
  (``lerobot_parallel.memory.measure_rank_bytes``) after its second step (the first one allocates the
  gradients and AdamW's states), and that step's peak: on CPU the rank's peak resident set during it
  (``VmHWM``, reset when it begins through ``/proc/self/clear_refs``), on CUDA
  ``torch.cuda.max_memory_allocated``, reported over what the rank held before it built the model
  (``peak``: everything the model costs at its worst moment) and over what it held when the step began
  (``transient``: all-gathered units, activations, reduce buffers on top of the states). The largest rank is
  reported with its ratio to DDP (target <= 1.05/2 for the states) and the plan's estimate, which must agree
  to the byte. fp32 weights (``torch_dtype=float32``, no mixed precision): the measured model compares
  sharding alone.
* **estimated**: LeRobot's full FastWAM (6,020,710,599 parameters) on the meta device, planned exactly as
  ``lerobot-train --dry_run=true`` plans it (``workload.sharding_plan`` with bf16 mixed precision: fp32
  masters for the trainable parameters, the frozen video expert kept in bf16), for DDP x8, FSDP2 x8 and
  HSDP 2x4, with and without ``freeze_video_expert``. Not run: a DDP rank of it needs ~90 GiB.

Transient memory is in the measured peak only; the plan's estimate covers parameters, gradients and
optimizer state. On GPUs run it with ``--device cuda`` (nccl).

    uv run python tools/bench/fastwam_memory.py [--device cpu] [--layers 30] [--heads 6] [--batch-size 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Self

from _memory_common import (
    ESTIMATE_HEADER,
    STATE_HEADER,
    above_target,
    estimate_columns,
    largest_rank,
    mib,
    plan_memory,
    run_workers,
    state_columns,
)

HEAD_DIM = 128  # LeRobot's attention head width, both experts
TEXT_DIM, CONTEXT_LEN = 256, 16
STATE_DIM = ACTION_DIM = 7
IMAGE = (64, 64)  # two 64x32 cameras side by side
FRAMES = 17  # raw window: every 4th frame, 5 frames, 2 latent frames after the VAE's 4x time compression
HORIZON = 16
FULL = {"DDP x8": ("--parallelism.dp_replicate=8",), "FSDP2 x8": ("--parallelism.dp_shard=8",)}
FULL["HSDP 2x4"] = ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=4")


def bench_config(layers: int, heads: int):
    """LeRobot's FastWAM structure at ``heads x 128`` channels of attention (30 layers of both experts by
    default), a 4x FFN, the action expert half the video expert's width."""
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies.fastwam.config import FastWAMConfig
    from lerobot_cli.policies.fastwam.dit_configs import default_action_dit_config, default_video_dit_config

    width = heads * HEAD_DIM
    video, action = default_video_dit_config(ACTION_DIM), default_action_dit_config(ACTION_DIM)
    video.update(num_layers=layers, num_heads=heads, hidden_dim=width, ffn_dim=4 * width, text_dim=TEXT_DIM)
    action.update(
        num_layers=layers, num_heads=heads, hidden_dim=width // 2, ffn_dim=2 * width, text_dim=TEXT_DIM
    )
    cameras = {
        f"observation.images.{name}": PolicyFeature(FeatureType.VISUAL, (3, IMAGE[0], IMAGE[1] // 2))
        for name in ("left", "right")
    }
    return FastWAMConfig(
        video_dit_config=video,
        action_dit_config=action,
        torch_dtype="float32",
        action_dim=ACTION_DIM,
        proprio_dim=STATE_DIM,
        image_size=IMAGE,
        num_video_frames=FRAMES,
        action_horizon=HORIZON,
        n_action_steps=HORIZON,
        load_text_encoder=False,
        base_model_id=None,
        input_features={
            **cameras,
            "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
    )


def _batch(config, batch_size: int, rank: int, device):
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    frames = config.model_video_frames
    batch = {
        **{
            key: torch.rand(batch_size, frames, *feature.shape, generator=g)
            for key, feature in config.image_features.items()
        },
        "observation.state": torch.randn(batch_size, frames, STATE_DIM, generator=g),
        "action": torch.randn(batch_size, HORIZON, ACTION_DIM, generator=g),
        "action_is_pad": torch.zeros(batch_size, HORIZON, dtype=torch.bool),
        "context": torch.randn(batch_size, CONTEXT_LEN, TEXT_DIM, generator=g),
        "context_mask": torch.ones(batch_size, CONTEXT_LEN, dtype=torch.bool),
    }
    return {k: v.to(device) for k, v in batch.items()}


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def held_bytes(device) -> int:
    """What this rank holds now: its resident set on CPU, the allocator's bytes on CUDA."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)
    return _status_bytes("VmRSS")


class StepPeak:
    """The rank's high-water mark during one step (see the module docstring)."""

    def __init__(self, device) -> None:
        self.device = device

    def __enter__(self) -> Self:
        import torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)
        self.before = held_bytes(self.device)
        return self

    def __exit__(self, *exc) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self.peak = _status_bytes("VmHWM")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from lerobot_cli.policies.fastwam.config import FastWAMConfig
    from lerobot_cli.policies.fastwam.frozen import FrozenParts
    from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy
    from lerobot_cli.policies.fastwam.vae import build_wan_vae, tiny_wan_vae_config
    from lerobot_parallel import ParallelismConfig, build_plan, parallel_session, wrap_model
    from lerobot_parallel.memory import measure_rank_bytes

    spec = FastWAMConfig.spec
    with parallel_session(ParallelismConfig(dp_shard=args.dp_shard), device=args.device) as rt:
        baseline = held_bytes(rt.device)  # before the model: the interpreter, torch, the process group
        torch.manual_seed(0)
        config = bench_config(args.layers, args.heads)
        vae = build_wan_vae(tiny_wan_vae_config(), dtype=torch.float32).to(rt.device)
        policy = FastWAMPolicy(config, frozen=FrozenParts(vae)).train()
        total = sum(p.numel() for p in policy.parameters())
        plan = build_plan(
            policy,
            rt,
            default_wrap_modules=list(spec.wrap_units),
            default_no_forward_modules=list(spec.no_forward_modules),
        )
        model = wrap_model(policy, rt, plan).model
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        batch = _batch(config, args.batch_size, rt.dp_rank, rt.device)

        def step() -> float:
            loss, _ = model(batch)
            loss.backward()
            opt.step()  # gradients stay: a training step holds params + grads + optimizer state at once
            return float(loss.detach())

        step()  # the first step allocates the gradients and AdamW's states
        opt.zero_grad(set_to_none=False)
        dist.barrier()
        start = time.perf_counter()
        with StepPeak(rt.device) as peak:
            loss = step()
        seconds = time.perf_counter() - start
        mine = measure_rank_bytes(model, opt)
        mine["peak"], mine["transient"] = peak.peak - baseline, peak.peak - peak.before
        mine["step_s"], mine["loss"] = seconds, loss
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
                        "units": [u.class_name for u in plan.units],
                        "root": plan.root.num_params,
                        "vae_bytes": FrozenParts(vae).nbytes(),
                        "estimate": plan_memory(plan.memory),
                    }
                )
            )


def launch(args: argparse.Namespace, nproc: int, dp_shard: int, out: Path) -> dict:
    me = [str(Path(__file__).resolve()), "--worker", "--out", str(out), "--dp-shard", str(dp_shard)]
    me += ["--device", args.device, "--layers", str(args.layers), "--heads", str(args.heads)]
    me += ["--batch-size", str(args.batch_size)]
    return run_workers(me, nproc, out, args.timeout)


def estimate_full_size() -> dict:
    """LeRobot's FastWAM on the meta device, planned as ``--dry_run=true`` plans it (bf16 mixed precision)."""
    import attrs
    import torch
    from lerobot_cli.cli.argv import split_argv
    from lerobot_cli.cli.build import build_train_config
    from lerobot_cli.policies.fastwam.config import FastWAMConfig
    from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy
    from lerobot_cli.workload import fp32_masters, sharding_plan
    from lerobot_parallel.runtime import ParallelRuntime

    out = {}
    for freeze in (False, True):
        with torch.device("meta"):
            policy = fp32_masters(FastWAMPolicy(FastWAMConfig(freeze_video_expert=freeze)), "bf16")
        params = sum(p.numel() for p in policy.parameters())
        trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        rows = {}
        for name, flags in FULL.items():
            parsed = build_train_config(split_argv([*flags, "--accelerator.mixed_precision=bf16"]).flags)
            cfg = attrs.evolve(parsed.config, policy=policy.config)
            plan = sharding_plan(cfg, policy, ParallelRuntime.preview(cfg.parallelism))
            rows[name] = {**plan_memory(plan.memory), "units": len(plan.units)}
        out["freeze_video_expert" if freeze else "all trainable"] = {
            "params": params,
            "trainable": trainable,
            "plans": rows,
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, auto")
    p.add_argument("--layers", type=int, default=30, help="MoT layers (LeRobot: 30)")
    p.add_argument("--heads", type=int, default=6, help="attention heads of 128 (LeRobot: 24)")
    p.add_argument("--batch-size", type=int, default=2, help="per rank")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--dp-shard", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "DDP x2": launch(args, 2, 1, Path(tmp) / "ddp.json"),
            "FSDP2 x2": launch(args, 2, 2, Path(tmp) / "fsdp.json"),
        }
    ddp_run = runs["DDP x2"]
    ddp = max(r["total"] for r in ddp_run["ranks"])
    ddp_peak = max(r["peak"] for r in ddp_run["ranks"])
    fsdp_run = runs["FSDP2 x2"]
    print(
        f"MEASURED: FastWAM, {args.layers} MoT layers, {args.heads} heads x {HEAD_DIM} "
        f"(video {args.heads * HEAD_DIM} wide, action {args.heads * HEAD_DIM // 2}): "
        f"{ddp_run['params']:,} parameters, all trainable; fp32, AdamW, device {args.device}, "
        f"batch {args.batch_size} per rank, {FRAMES} frames of {IMAGE[0]}x{IMAGE[1]}; "
        f"tiny frozen VAE {mib(ddp_run['vae_bytes']).strip()} per rank (outside the counts)"
    )
    units = fsdp_run["units"]
    print(
        f"  FSDP2 units: {len(units)} x {units[0]} + the root ({fsdp_run['root']:,} params); largest rank "
        "(params + grads + optimizer state after its second step; peak = its high-water mark during that "
        "step over what it held before the model was built; transient = peak over what it held when the "
        "step began)"
    )
    print(f"  {'topology':<10} {STATE_HEADER} {'peak':>13} {'ratio':>7} {'transient':>13} {'step':>7}")
    summary: dict = {"measured": {}, "estimated": {}}
    for name, run in runs.items():
        top, n, ratio, target = largest_rank(run, ddp)
        peak = max(r["peak"] for r in run["ranks"])
        transient = max(r["transient"] for r in run["ranks"])
        step_s = max(r["step_s"] for r in run["ranks"])
        summary["measured"][name] = {
            "ratio": ratio,
            "target": target,
            "bytes": top,
            "estimate": run["estimate"],
            "peak": peak,
            "peak_ratio": peak / ddp_peak,
            "transient": transient,
            "losses": [r["loss"] for r in run["ranks"]],
        }
        exact = "" if top["total"] == run["estimate"]["total"] else "  ESTIMATE DIFFERS"
        print(
            f"  {name:<10} {state_columns(top, ratio, target, run['estimate'])} "
            f"{mib(peak)} {peak / ddp_peak:7.3f} {mib(transient)} {step_s:6.1f}s"
            f"{above_target(n, ratio, target)}{exact}"
        )

    est = estimate_full_size()
    print(
        "ESTIMATED (LeRobot's full FastWAM on the meta device, planned as --dry_run=true plans it, bf16 "
        "mixed precision: fp32 masters for trainable parameters, frozen ones kept bf16; AdamW; not run)"
    )
    print(f"  {'topology':<10} {ESTIMATE_HEADER} {'ratio':>7}")
    for setting, row in est.items():
        ddp_est = row["plans"]["DDP x8"]["total"]
        summary["estimated"][setting] = row
        print(f"  {setting}: {row['params']:,} parameters, {row['trainable']:,} trained")
        for name, m in row["plans"].items():
            units = f"  ({m['units']} MoTLayer units + the root)" if m["units"] else ""
            print(f"  {name:<10} {estimate_columns(m)} {m['total'] / ddp_est:7.4f}{units}")
    print(f"(wall time {time.perf_counter() - started:.0f} s)")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
