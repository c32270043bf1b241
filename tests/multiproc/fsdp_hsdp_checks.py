"""Run under ``torchrun --nproc-per-node=4``: HSDP (dp_replicate=2 x dp_shard=2) checks in ONE launch.

Each rank writes ``rank<r>.json`` into argv[1]; the pytest side compares with single-process
references computed in its own process (``fsdp_workload.py``).
"""

from __future__ import annotations

from _common import arm_watchdog, out_path, rank, write_json

arm_watchdog(150)

import torch
import torch.distributed as dist
from fsdp_workload import accumulation_trace, json_ready, train
from lerobot_parallel import FSDPConfig, ParallelismConfig
from lerobot_parallel.teardown import parallel_session
from regions_checks import regions_check
from torch.distributed.tensor import DTensor


def local_shards(model: torch.nn.Module) -> dict:
    return {
        name: {
            "full": list(p.shape),
            "local": list(p.to_local().shape),
            "placements": [str(pl) for pl in p.placements],
            "values": p.to_local().flatten().tolist(),
        }
        for name, p in model.named_parameters()
        if isinstance(p, DTensor)
    }


def main() -> None:
    res: dict = {}
    with parallel_session(ParallelismConfig(dp_replicate=2, dp_shard=2), device="cpu") as rt:
        res["runtime"] = {
            "mode": rt.mode,
            "mesh_dim_names": list(rt.mesh.mesh_dim_names),
            "mesh_shape": list(rt.mesh.shape),
            "dp_rank": rt.dp_rank,
            "dp_world_size": rt.dp_world_size,
            "replicate_rank": rt.dp_replicate_rank,
            "shard_rank": rt.dp_shard_rank,
        }
        # fp32, B=2 on each of 4 dp workers: the global batch of 8 of one process with B=8.
        run = train(rt, batch_size=2, steps=4)
        res["fp32"] = json_ready(run)
        res["fp32"]["shards"] = local_shards(run["model"])  # after training: replicas must hold equal shards
        # Accumulation B=1 x K=2 over 4 workers: 3 updates of 8 samples; no reduce-scatter (nor
        # all-reduce) on the first micro-batch of a window.
        res["accum"] = accumulation_trace(rt, batch_size=1, grad_accum=2, steps=6)
        # Ignored module under HSDP: gradients averaged over all 4 dp ranks, head identical everywhere.
        head: list[list[float]] = []
        ign = train(
            rt,
            batch_size=2,
            steps=3,
            grad_clip_norm=0.05,
            fsdp=FSDPConfig(ignored_modules="head"),
            on_step=lambda loop, out: head.append(
                torch.cat([p.detach().flatten() for p in loop.model.head.parameters()]).tolist()
            ),
        )
        res["ignored"] = json_ready(ign)
        res["ignored"]["head"] = head
        # fp16 under HSDP: the scaler's inf check spans shards and replicas; every rank skips alike.
        res["fp16"] = json_ready(
            train(
                rt,
                batch_size=2,
                steps=3,
                mixed_precision="fp16",
                scheduler=True,
                init_scale=2.0**40,
                backoff_factor=2.0**-32,
            )
        )
        res["regions"] = regions_check(rt)  # activation checkpointing under HSDP
        dist.barrier()
    write_json(out_path(f"rank{rank()}.json"), res)


if __name__ == "__main__":
    main()
