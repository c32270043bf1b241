"""Per-rank memory of SmolVLA: FSDP2 x2 vs DDP x2 measured side by side, the full-size plan on 4 and 8 GPUs.

Two kinds of numbers, labelled as such in the output:

* **measured**: real processes launched from this one invocation, one topology after the other (torchrun,
  CPU/gloo by default, OMP_NUM_THREADS=1 per rank), through the real engine (``lerobot_parallel.build_plan``
  with SmolVLA's spec, as ``lerobot-train`` plans it: each VLM text layer and its expert layer one grouped
  unit, each vision encoder layer a unit, the token embedding and the unused ``lm_head`` units of their own;
  then ``wrap_model``). Each rank builds the same seeded SmolVLA from SmolVLM2-500M's own config
  (tests/data/smolvlm2_500m_video_instruct_config.json: LeRobot's default 16 of its 32 text layers, its
  12-layer vision tower, its 49,280-token vocabulary) with two changes that keep a CPU step short: the
  vision tower's ``image_size`` (``--image-size``, 128 by default: 64 patches, 4 image tokens after the pixel
  shuffle; only the position embedding shrinks, by 0.7 M parameters) and every weight in fp32 (the config's
  bf16 text model would need bf16 mixed precision; fp32 compares sharding alone). LeRobot's defaults freeze
  the vision tower and the whole VLM (``train_expert_only``): a quarter of the parameters train. Each rank
  runs two real training steps (``SmolVLAPolicy.forward``: LeRobot's flow-matching loss, the prompt given
  as tokens) with AdamW and counts the bytes it then holds in parameter, gradient and optimizer-state
  storages (``lerobot_parallel.memory.measure_rank_bytes``), the frozen parameters' share apart: sharded
  under FSDP2 as the rest, but with no gradient and no optimizer state. The largest rank is reported with
  its ratio to DDP's (target <= 1.05/2) and the plan's estimate (which must agree to the byte).
* **estimated**: the full-size SmolVLA (SmolVLM2-500M's config as it is, 450,046,176 parameters) on the meta
  device, planned exactly as ``lerobot-train --dry_run=true`` plans it (``workload.sharding_plan`` with bf16
  mixed precision: fp32 masters for the trainable parameters, the frozen bf16 towers kept bf16) for DDP,
  FSDP2 and HSDP on 4 and 8 GPUs, with LeRobot's ``train_expert_only`` and with the VLM trained. Not run.

Transient memory (a unit's all-gathered parameters, activations) is in neither number. On CPU the step times
are gloo's over loopback TCP (FSDP2 all-gathers every unit in forward and backward; DDP all-reduces the
trainable gradients once). On GPUs run it with ``--device cuda`` (nccl).

    uv run python tools/bench/smolvla_memory.py [--device cpu] [--image-size 128] [--vlm-layers 16]
                                                [--batch-size 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _memory_common import (
    ESTIMATE_HEADER,
    STATE_HEADER,
    above_target,
    estimate_columns,
    gib,
    largest_rank,
    mib,
    plan_memory,
    run_workers,
    state_columns,
)

REPO = Path(__file__).resolve().parents[2]
FULL_CONFIG = (
    REPO / "packages" / "lerobot-cli" / "tests" / "data" / "smolvlm2_500m_video_instruct_config.json"
)
STATE_DIM = ACTION_DIM = 6
TOKENS = 16
CHUNK = 50  # LeRobot's chunk_size
FULL = {
    "DDP x4": ("--parallelism.dp_replicate=4",),
    "FSDP2 x4": ("--parallelism.dp_shard=4",),
    "DDP x8": ("--parallelism.dp_replicate=8",),
    "FSDP2 x8": ("--parallelism.dp_shard=8",),
    "HSDP 2x4": ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=4"),
}


def write_vlm(directory: Path, image_size: int | None) -> Path:
    """SmolVLM2-500M's config.json in ``directory``; with ``image_size``, that vision input size and every
    weight fp32 (the measured model), else as it is (the estimated one)."""
    config = json.loads(FULL_CONFIG.read_text())
    config.pop("_source")
    if image_size is not None:
        config["vision_config"]["image_size"] = image_size
        config.pop("torch_dtype", None)
        config["text_config"].pop("torch_dtype", None)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def policy_config(vlm: Path, image_size: int, vlm_layers: int, **overrides):
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies.smolvla.config import SmolVLAConfig

    return SmolVLAConfig(
        vlm_model_name=str(vlm),
        num_vlm_layers=vlm_layers,
        resize_imgs_with_padding=(image_size, image_size),
        input_features={
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, image_size, image_size)),
            "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
        **overrides,
    )


def _batch(config, batch_size: int, rank: int, device):
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    size = config.resize_imgs_with_padding[0]
    batch = {
        "observation.images.top": torch.rand(batch_size, 3, size, size, generator=g),
        "observation.state": torch.randn(batch_size, STATE_DIM, generator=g),
        "action": torch.randn(batch_size, config.chunk_size, ACTION_DIM, generator=g),
        "observation.language.tokens": torch.randint(4, 49_000, (batch_size, TOKENS), generator=g),
        "observation.language.attention_mask": torch.ones(batch_size, TOKENS, dtype=torch.bool),
    }
    return {k: v.to(device) for k, v in batch.items()}


def frozen_bytes(model) -> int:
    """Bytes of this rank's frozen parameter storages (a DTensor's local shard), each storage once."""
    from lerobot_parallel.memory import storage_bytes

    return storage_bytes(p for p in model.parameters() if not p.requires_grad)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from lerobot_cli.policies.smolvla.config import SmolVLAConfig
    from lerobot_cli.policies.smolvla.modeling import SmolVLAPolicy
    from lerobot_parallel import ParallelismConfig, build_plan, parallel_session, wrap_model
    from lerobot_parallel.memory import measure_rank_bytes

    spec = SmolVLAConfig.spec
    with parallel_session(ParallelismConfig(dp_shard=args.dp_shard), device=args.device) as rt:
        torch.manual_seed(0)
        config = policy_config(Path(args.vlm), args.image_size, args.vlm_layers)
        policy = SmolVLAPolicy(config).train()
        total = sum(p.numel() for p in policy.parameters())
        trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        plan = build_plan(
            policy,
            rt,
            default_wrap_modules=list(spec.wrap_units or ()),
            default_unit_groups=list(spec.unit_groups),
            default_no_forward_modules=list(spec.no_forward_modules),
        )
        model = wrap_model(policy, rt, plan).model
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        batch = _batch(config, args.batch_size, rt.dp_rank, rt.device)

        def step() -> float:
            dist.barrier()
            start = time.perf_counter()
            loss, _ = model(batch)
            loss.backward()
            opt.step()  # gradients stay: a training step holds params + grads + optimizer state at once
            if rt.device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        step()  # the first step allocates the gradients and AdamW's states
        opt.zero_grad(set_to_none=False)
        seconds = step()
        mine = {**measure_rank_bytes(model, opt), "frozen": frozen_bytes(model), "step_s": seconds}
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
                        "units": [u.class_name for u in plan.units],
                        "root": plan.root.num_params,
                        "estimate": {**plan_memory(plan.memory), "frozen": plan.memory.frozen_params},
                    }
                )
            )


def launch(args: argparse.Namespace, vlm: Path, dp_shard: int, out: Path) -> dict:
    me = [str(Path(__file__).resolve()), "--worker", "--out", str(out), "--dp-shard", str(dp_shard)]
    me += ["--device", args.device, "--image-size", str(args.image_size), "--vlm", str(vlm)]
    me += ["--vlm-layers", str(args.vlm_layers), "--batch-size", str(args.batch_size)]
    return run_workers(me, 2, out, args.timeout)


def estimate_full_size(vlm: Path) -> dict:
    """The full-size SmolVLA on the meta device, planned as ``--dry_run=true`` plans it (bf16 mixed
    precision), for each FULL topology, with LeRobot's train_expert_only and with the VLM trained."""
    import attrs
    import torch
    from lerobot_cli.cli.argv import split_argv
    from lerobot_cli.cli.build import build_train_config
    from lerobot_cli.policies.smolvla.modeling import SmolVLAPolicy
    from lerobot_cli.workload import fp32_masters, sharding_plan
    from lerobot_parallel.runtime import ParallelRuntime

    out = {}
    for train_expert_only in (True, False):
        with torch.device("meta"):
            config = policy_config(vlm, 512, 16, train_expert_only=train_expert_only)
            policy = fp32_masters(SmolVLAPolicy(config), "bf16")
        params = sum(p.numel() for p in policy.parameters())
        trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        rows = {}
        for name, flags in FULL.items():
            parsed = build_train_config(split_argv([*flags, "--accelerator.mixed_precision=bf16"]).flags)
            cfg = attrs.evolve(parsed.config, policy=policy.config)
            plan = sharding_plan(cfg, policy, ParallelRuntime.preview(cfg.parallelism))
            rows[name] = {**plan_memory(plan.memory), "frozen": plan.memory.frozen_params}
        setting = "train_expert_only (LeRobot's default)" if train_expert_only else "VLM trained too"
        out[setting] = {"params": params, "trainable": trainable, "plans": rows}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, auto")
    p.add_argument("--image-size", type=int, default=128, help="vision input size (multiple of 64)")
    p.add_argument("--vlm-layers", type=int, default=16, help="num_vlm_layers (LeRobot: 16)")
    p.add_argument("--batch-size", type=int, default=2, help="per rank")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--vlm", help=argparse.SUPPRESS)
    p.add_argument("--dp-shard", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        vlm = write_vlm(Path(tmp) / "measured_vlm", args.image_size)
        runs = {
            "DDP x2": launch(args, vlm, 1, Path(tmp) / "ddp.json"),
            "FSDP2 x2": launch(args, vlm, 2, Path(tmp) / "fsdp.json"),
        }
        est = estimate_full_size(write_vlm(Path(tmp) / "full_vlm", None))
    ddp_run, fsdp_run = runs["DDP x2"], runs["FSDP2 x2"]
    ddp = max(r["total"] for r in ddp_run["ranks"])
    print(
        f"MEASURED: SmolVLA on SmolVLM2-500M's config, {args.vlm_layers} VLM layers, vision input "
        f"{args.image_size}x{args.image_size}: {ddp_run['params']:,} parameters, {ddp_run['trainable']:,} "
        f"trainable (train_expert_only); fp32, AdamW, device {args.device}, "
        f"batch {args.batch_size} per rank, chunk {CHUNK}"
    )
    kinds: dict[str, int] = {}
    for name in fsdp_run["units"]:
        kinds[name] = kinds.get(name, 0) + 1
    print(
        f"  FSDP2 units: {', '.join(f'{k} x{n}' for k, n in kinds.items())} + the root "
        f"({fsdp_run['root']:,} params); largest rank after its second step (params + grads + optimizer "
        "state; frozen = the frozen parameters' share of params)"
    )
    print(f"  {'topology':<10} {STATE_HEADER} {'frozen':>13} {'ratio':>7} {'step':>7}")
    summary: dict = {"measured": {}, "estimated": {}}
    ddp_frozen = max(r["frozen"] for r in ddp_run["ranks"])
    for name, run in runs.items():
        top, n, ratio, target = largest_rank(run, ddp)
        step_s = max(r["step_s"] for r in run["ranks"])
        summary["measured"][name] = {
            "ratio": ratio,
            "target": target,
            "bytes": top,
            "estimate": run["estimate"],
            "frozen_ratio": top["frozen"] / ddp_frozen,
        }
        exact = "" if top["total"] == run["estimate"]["total"] else "  ESTIMATE DIFFERS"
        exact += "" if top["frozen"] == run["estimate"]["frozen"] else "  FROZEN ESTIMATE DIFFERS"
        print(
            f"  {name:<10} {state_columns(top, ratio, target, run['estimate'])} {mib(top['frozen'])} "
            f"{top['frozen'] / ddp_frozen:7.4f} {step_s:6.1f}s{above_target(n, ratio, target)}{exact}"
        )

    print(
        "ESTIMATED (the full-size SmolVLA on SmolVLM2-500M's config on the meta device, planned as "
        "--dry_run=true plans it, bf16 mixed precision: fp32 masters for trainable parameters, the frozen "
        "bf16 towers kept bf16; AdamW; not run)"
    )
    print(f"  {'topology':<10} {ESTIMATE_HEADER} {'frozen':>11} {'ratio':>7}")
    for setting, row in est.items():
        summary["estimated"][setting] = row
        print(f"  {setting}: {row['params']:,} parameters, {row['trainable']:,} trained")
        for name, m in row["plans"].items():
            ddp_est = row["plans"]["DDP x8" if name.endswith(("x8", "2x4")) else "DDP x4"]["total"]
            print(f"  {name:<10} {estimate_columns(m)} {gib(m['frozen'])} {m['total'] / ddp_est:7.4f}")
    print(f"(wall time {time.perf_counter() - started:.0f} s)")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
