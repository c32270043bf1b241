"""Run under ``torchrun --nproc-per-node=2``: engine and loop checks in ONE launch.

Each rank writes ``rank<r>.json`` into the directory given as argv[1]; the pytest side
compares it with a single-process reference computed in its own process.
"""

from __future__ import annotations

from _common import arm_watchdog, out_path, rank, write_json

arm_watchdog(120)

import torch
import torch.distributed as dist
from _workload import flat_params, train
from lerobot_parallel import parallel_session
from lerobot_trainloop import MetricsTracker, ShardedBatchSampler
from lerobot_trainloop import metrics as metrics_module
from lerobot_trainloop.testing import SyntheticRegression
from regions_checks import regions_check
from sync_checks import ddp_syncs, nan_rank1
from torch.utils.data import DataLoader


def same_on_all_ranks(t: torch.Tensor) -> bool:
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t.contiguous())
    return all(torch.equal(gathered[0], g) for g in gathered)


def grads_flat(model) -> torch.Tensor:
    return torch.cat([p.grad.detach().flatten() for p in model.parameters() if p.grad is not None])


def main() -> None:
    result: dict = {}
    with parallel_session(device="cpu") as rt:
        mesh = rt.mesh
        result["runtime"] = {
            "rank": rt.rank,
            "world_size": rt.world_size,
            "local_rank": rt.local_rank,
            "dp_rank": rt.dp_rank,
            "dp_world_size": rt.dp_world_size,
            "backend": rt.backend,
            "device": str(rt.device),
            "mesh_dim_names": list(mesh.mesh_dim_names),
            "mesh_shape": list(mesh.shape),
            "mode": rt.mode,
            "is_main": rt.is_main,
            "owns_process_group": rt.owns_process_group,
            "launcher": rt.launcher,
            "timeout_s": rt.timeout_s,
        }

        # DDP, B=4 per rank, K=1: the global batch of 8 equals the single-process B=8 run.
        params_same: list[bool] = []
        result["ddp_k1"] = train(
            rt,
            batch_size=4,
            grad_accum=1,
            steps=4,
            on_step=lambda loop, out: params_same.append(same_on_all_ranks(flat_params(loop.model))),
        )
        result["ddp_k1"]["params_same_each_step"] = params_same

        # DDP, B=2, K=2: gradients must stay local on the first micro-batch (no_sync) and be
        # identical after the second's all-reduce, which we see as identical parameters.
        probe: list[dict] = []

        def k2_probe(loop, out):
            entry = {"step": out.step, "synced": out.synced}
            if not out.synced:
                entry["grads_same"] = same_on_all_ranks(grads_flat(loop.model))
            entry["params_same"] = same_on_all_ranks(flat_params(loop.model))
            entry["model_type"] = type(loop.model).__name__
            probe.append(entry)

        result["ddp_k2"] = train(rt, batch_size=2, grad_accum=2, steps=6, on_step=k2_probe)
        result["ddp_k2"]["probe"] = probe

        # bf16 autocast under DDP: fp32 parameters, finite losses, replicas in step.
        bf16_same: list[bool] = []
        result["bf16"] = train(
            rt,
            batch_size=4,
            grad_accum=1,
            steps=2,
            mixed_precision="bf16",
            on_step=lambda loop, out: bf16_same.append(same_on_all_ranks(flat_params(loop.model))),
        )
        result["bf16"]["params_same_each_step"] = bf16_same
        # fp16 with an initial scale that must overflow: every rank skips the same update and the
        # scheduler waits with it (gradients are all-reduced before the scaler looks at them).
        result["fp16"] = train(
            rt,
            batch_size=4,
            grad_accum=1,
            steps=3,
            mixed_precision="fp16",
            scheduler=True,
            init_scale=2.0**40,
            backoff_factor=2.0**-32,
        )

        # Sampler through a DataLoader with worker processes: 10 steps of 2 x 3 = 60 samples = 3 epochs of 20.
        ds = SyntheticRegression(20, seed=0)
        sampler = ShardedBatchSampler(len(ds), 3, dp_rank=rt.dp_rank, dp_world_size=rt.dp_world_size, seed=7)
        loader = DataLoader(ds, batch_sampler=sampler, num_workers=2)
        seen: list[list[int]] = []
        for step, batch in enumerate(loader):
            seen.append(batch["index"].tolist())
            sampler.consume()
            if step + 1 == 10:
                break
        result["sampler"] = {"batches": seen, "state": sampler.state_dict()}

        # Metric reduction with rank-dependent values, counting collectives.
        calls = {"n": 0}
        real = metrics_module.dist.all_gather_into_tensor

        def counting(*args, **kwargs):
            calls["n"] += 1
            return real(*args, **kwargs)

        metrics_module.dist.all_gather_into_tensor = counting
        try:
            r = rt.rank
            tracker = MetricsTracker(
                {
                    "loss": "mean",
                    "step_s": "max",
                    "data_s": "max",
                    "samples": "sum",
                    "low": "min",
                    "lr": "local",
                }
            )
            for v in (r + 1.0, r + 3.0):  # window mean r + 2
                tracker.update("loss", v)
            tracker.update("step_s", 0.1 * (r + 1))
            tracker.update("data_s", 0.5 - 0.1 * r)
            tracker.update("samples", 4 * (r + 1))
            tracker.update("low", 10.0 - r)
            tracker.update("lr", 0.001 * (r + 1))
            if r == 0:
                tracker.update("only_rank0", 42.0)
            else:
                tracker.declare("only_rank0", "mean")  # present but empty on rank 1: NaN, ignored
            reduced = tracker.reduce(rt.dp_group, rt.device, rt.dp_world_size)
        finally:
            metrics_module.dist.all_gather_into_tensor = real
        result["metrics"] = {"reduced": reduced, "collectives": calls["n"]}
        result["regions"] = regions_check(rt)  # activation checkpointing under DDP
        result["ddp_syncs"] = ddp_syncs(rt)  # no blocking read or collective on non-log steps
        result["nan_rank1"] = nan_rank1(rt)  # both ranks stop, naming rank 1 and its step

    write_json(out_path(f"rank{rank()}.json"), result)


if __name__ == "__main__":
    main()
