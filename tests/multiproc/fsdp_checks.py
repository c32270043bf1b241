"""Run under ``torchrun --nproc-per-node=2``: FSDP2 (dp_shard=2) checks in ONE launch.

Each rank writes ``rank<r>.json`` into argv[1]; the pytest side compares it with single-process
references computed in its own process with the same workload (``fsdp_workload.py``).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from _common import arm_watchdog, out_path, rank, write_json

arm_watchdog(150)

import torch
import torch.distributed as dist
from fsdp_workload import CollectiveSpy, accumulation_trace, full, json_ready, train, train_act
from lerobot_parallel import (
    AcceleratorConfig,
    ActivationCheckpointingConfig,
    FSDPConfig,
    MixedPrecisionPolicyConfig,
    ParallelismConfig,
    ShardingError,
)
from lerobot_parallel.memory import measure_rank_bytes
from lerobot_parallel.plan import build_plan
from lerobot_parallel.teardown import parallel_session
from lerobot_parallel.testing import BlockRegressor, PlainRegressor, TiedTokenModel
from lerobot_parallel.wrap import wrap_model
from regions_checks import block_calls, params_gathered, regions_check, summarize
from torch.distributed.tensor import DTensor


def same_on_all_ranks(t: torch.Tensor) -> bool:
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t.contiguous())
    return all(torch.equal(gathered[0], g) for g in gathered)


def shard_facts(model: torch.nn.Module) -> dict:
    facts = {}
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        numels = [torch.zeros((), dtype=torch.long) for _ in range(dist.get_world_size())]
        dist.all_gather(numels, torch.tensor(local.numel()))
        facts[name] = {
            "type": type(p).__name__,
            "full": list(p.shape),
            "local": list(local.shape),
            "all_local_numel": [int(n) for n in numels],
            "device": str(local.device),
            "placements": [str(pl) for pl in getattr(p, "placements", ())],
        }
    return facts


def offload_flags(model: torch.nn.Module) -> list[bool]:
    """FSDP2's own record of whether each sharded parameter lives offloaded to the CPU."""
    from torch.distributed.fsdp import FSDPModule

    flags = set()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            flags |= {fp.offload_to_cpu for fp in (group.fsdp_params if group is not None else [])}
    return sorted(flags)


def train_with_poisoned_shard(rt) -> dict:
    """``train`` in fp16 where, at the first update, rank 0 alone finds an inf in its local gradient shard."""
    from lerobot_parallel.precision import Precision

    original, seen = Precision.unscale_, []

    def unscale_(self, optimizer):
        if not seen and rank() == 0:
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            local = next(
                x for x in (g.to_local() if isinstance(g, DTensor) else g for g in grads) if x.numel()
            )
            local.view(-1)[0] = float("inf")
        seen.append(True)
        return original(self, optimizer)

    Precision.unscale_ = unscale_
    try:
        return train(
            rt,
            batch_size=4,
            steps=3,
            mixed_precision="fp16",
            scheduler=True,
            init_scale=2.0**8,
            backoff_factor=0.5,
        )
    finally:
        Precision.unscale_ = original


README = Path(__file__).resolve().parents[2] / "packages/lerobot-parallel/README.md"


def readme_fsdp_example() -> str:
    """The python block under the README's sharded-example heading, run as written."""
    text = README.read_text()
    section = text[text.index("### Sharded example") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def joint_towers_check(rt) -> dict:
    """Grouped units: every rank runs the same full batch, so the averaged gradient must equal the one
    process's bitwise (``(g + g) / 2 == g`` in fp32); plus the unit list and the naive (ungrouped) wrap."""
    from lerobot_parallel.testing import JointTowers

    model = JointTowers()
    plan = build_plan(model, rt)
    wrapped = wrap_model(model, rt, plan)
    loss, _ = wrapped.model(JointTowers.batch(4, seed=3))
    loss.backward()
    grads = {
        n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).flatten().tolist()
        for n, p in wrapped.model.named_parameters()
    }
    naive = JointTowers()
    naive_plan = build_plan(naive, rt, AcceleratorConfig(fsdp=FSDPConfig(wrap_modules=("SideTowerLayer",))))
    return {
        "loss": float(loss),
        "grads": grads,
        "units": [u.label for u in plan.units],
        "naive_units": [u.label for u in naive_plan.units],
        "shards": shard_facts(wrapped.model),
    }


def pi0_check(rt) -> dict:
    """Tiny pi0 under FSDP2 with its grouped joint-layer units: the same full batch on every rank, so
    the gradients must equal one process's bitwise; every parameter is a DTensor shard."""
    from lerobot_cli.policies.common.paligemma.gemma import ExpertLayer, PaliGemmaLayer
    from pi0_tiny import pi0_batch, tiny_pi0

    def run(acc: AcceleratorConfig) -> tuple[torch.nn.Module, torch.Tensor, dict]:
        """One forward and backward, recording each ``PaliGemmaLayer.joint`` call (see regions_checks)."""
        with block_calls(PaliGemmaLayer, "joint") as calls:
            policy = tiny_pi0()
            model = wrap_model(policy, rt, build_plan(policy, rt, acc)).model
            loss, _ = model(*pi0_batch())
            layers = [m for m in model.modules() if isinstance(m, PaliGemmaLayer)]
            experts = [m for m in model.modules() if isinstance(m, ExpertLayer)]
            calls["resharded_before_backward"] = all(not params_gathered(m) for m in [*layers, *experts])
            calls["phase"] = "backward"
            loss.backward()
        return model, loss.detach(), summarize(calls)

    model, loss, calls = run(AcceleratorConfig())
    grads = {
        n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).flatten().tolist()
        for n, p in model.named_parameters()
        if p.grad is not None
    }
    # --policy.gradient_checkpointing=true is activation checkpointing of the units: the joint method,
    # checkpointed and registered with FSDP, recomputes each pair after FSDP gathered it again in backward
    ac_model, ac_loss, ac_calls = run(
        AcceleratorConfig(activation_checkpointing=ActivationCheckpointingConfig("full"))
    )
    ac_diff = max(
        float(
            (
                (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).flatten()
                - torch.tensor(grads[n])
            )
            .abs()
            .max()
        )
        for n, p in ac_model.named_parameters()
        if p.grad is not None
    )
    return {
        "loss": float(loss),
        "grads": grads,
        "shards": shard_facts(model),
        "grouped": [u.label for u in build_plan(tiny_pi0(), rt).units if u.members],
        "checkpointed_loss": float(ac_loss),
        "checkpointed_grad_diff": ac_diff,
        "calls": calls,
        "checkpointed_calls": ac_calls,
    }


def main() -> None:
    res: dict = {}
    with parallel_session(ParallelismConfig(dp_shard=2), device="cpu") as rt:
        res["runtime"] = {
            "mode": rt.mode,
            "mesh_dim_names": list(rt.mesh.mesh_dim_names),
            "mesh_shape": list(rt.mesh.shape),
            "dp_rank": rt.dp_rank,
            "dp_world_size": rt.dp_world_size,
        }

        # Refusals happen before any collective, identically on every rank.
        for key, make in (
            ("no_units", lambda: build_plan(PlainRegressor(), rt)),
            ("tied", lambda: build_plan(TiedTokenModel(), rt)),
        ):
            try:
                make()
                res[key] = "accepted"
            except ShardingError as exc:
                res[key] = str(exc)

        res["joint"] = joint_towers_check(rt)
        # activation checkpointing under FSDP2, and inductor-compiled units inside fully_shard
        res["regions"] = regions_check(rt, compile_backend="inductor")
        res["pi0"] = pi0_check(rt)

        # fp32 FSDP2, B=4 per rank: same global batch as one process with B=8.
        shards = {}
        res["fp32"] = json_ready(
            train(rt, batch_size=4, steps=4, on_wrapped=lambda m: shards.update(shard_facts(m)))
        )
        res["fp32"]["shards"] = shards

        # Gradient accumulation, B=2 x K=2: no reduce-scatter on the first micro-batch of each window.
        res["accum"] = accumulation_trace(rt, batch_size=2, grad_accum=2, steps=6)

        # Clipping over DTensor gradients (and over DTensor + plain ones with an ignored module).
        res["clip"] = json_ready(train(rt, batch_size=4, steps=3, grad_clip_norm=0.05))
        head_same: list[bool] = []
        head_types: dict = {}

        def ignored_probe(loop, out):
            head = loop.model.head
            head_types.update({n: type(p).__name__ for n, p in head.named_parameters()})
            head_same.append(same_on_all_ranks(torch.cat([p.detach().flatten() for p in head.parameters()])))

        res["ignored"] = json_ready(
            train(
                rt,
                batch_size=4,
                steps=3,
                grad_clip_norm=0.05,
                fsdp=FSDPConfig(ignored_modules=r"head"),
                on_step=ignored_probe,
            )
        )
        res["ignored"]["head_same_each_step"] = head_same
        res["ignored"]["head_types"] = head_types

        # Size-based units and no resharding after forward: same numbers, other wrapping.
        plan = build_plan(PlainRegressor(), rt, AcceleratorConfig(fsdp=FSDPConfig(min_num_params=300)))
        res["min_params_units"] = [u.path for u in plan.units]
        res["min_params"] = json_ready(
            train(
                rt,
                batch_size=4,
                steps=3,
                model_factory=PlainRegressor,
                fsdp=FSDPConfig(min_num_params=300, reshard_after_forward=False),
            )
        )

        # Mixed precision: the derived policy, then each explicit-policy rule, with the dtype FSDP reduces in.
        variants = {
            "bf16": ("bf16", FSDPConfig()),
            "mpp_param_only": (
                "no",
                FSDPConfig(mixed_precision_policy=MixedPrecisionPolicyConfig(param_dtype="bfloat16")),
            ),
            "mpp_reduce_bf16": (
                "no",
                FSDPConfig(
                    mixed_precision_policy=MixedPrecisionPolicyConfig(
                        param_dtype="bfloat16", reduce_dtype="bfloat16"
                    )
                ),
            ),
            "mpp_no_cast": (
                "bf16",
                FSDPConfig(
                    mixed_precision_policy=MixedPrecisionPolicyConfig(
                        param_dtype="bfloat16", cast_forward_inputs=False
                    )
                ),
            ),
            # Head a unit too: it casts the fp32 block outputs back to bf16
            # (CPU layer_norm refuses mixed dtypes)
            "mpp_output_fp32": (
                "bf16",
                FSDPConfig(
                    wrap_modules=("Block", "Head"),
                    mixed_precision_policy=(
                        MixedPrecisionPolicyConfig(param_dtype="bfloat16", output_dtype="float32")
                    ),
                ),
            ),
        }
        for key, (mp, cfg) in variants.items():
            with CollectiveSpy() as spy:
                res[key] = json_ready(train(rt, batch_size=4, steps=3, mixed_precision=mp, fsdp=cfg))
                res[key]["reduce_dtypes"] = sorted(set(spy.calls))
        # fp16: an initial scale that must overflow; every rank skips the same update, the scheduler waits.
        with CollectiveSpy() as spy:
            res["fp16"] = json_ready(
                train(
                    rt,
                    batch_size=4,
                    steps=3,
                    mixed_precision="fp16",
                    scheduler=True,
                    init_scale=2.0**40,
                    backoff_factor=2.0**-32,
                )
            )
            res["fp16"]["reduce_dtypes"] = sorted(set(spy.calls))

        # fp16 with an overflow in ONE rank's gradient shard only (rank 0, step 1; no scale overflows by
        # itself): the skip must be decided together, or rank 1 would apply that update to its shard alone.
        res["fp16_one_shard"] = json_ready(train_with_poisoned_shard(rt))

        # CPU offload on a CPU-only build (pin_memory off), AdamW, and measured vs estimated bytes.
        offload_shards: dict = {}
        off = train(
            rt,
            batch_size=4,
            steps=3,
            optimizer="adamw",
            fsdp=FSDPConfig(cpu_offload=True),
            on_wrapped=lambda m: offload_shards.update(shard_facts(m)),
        )
        res["offload"] = json_ready(off)
        res["offload"]["devices"] = sorted({f["device"] for f in offload_shards.values()})
        # On a CPU-only machine every parameter is on the CPU anyway: what shows the offload policy is
        # applied is FSDP's own per-parameter flag, set for this run and not for a default one.
        res["offload"]["offload_to_cpu"] = offload_flags(off["model"])
        plain = BlockRegressor()
        res["offload"]["default_offload_to_cpu"] = offload_flags(
            wrap_model(plain, rt, build_plan(plain, rt, AcceleratorConfig())).model
        )
        res["offload"]["measured"] = measure_rank_bytes(off["model"], off["optimizer"])
        # grads were zeroed (set_to_none) after the last update: measure what a step holds
        loss, _ = off["model"]({"x": torch.randn(4, 8), "y": torch.randn(4, 4)})
        loss.backward()
        res["offload"]["measured_with_grads"] = measure_rank_bytes(off["model"], off["optimizer"])
        est = build_plan(
            BlockRegressor(), rt, AcceleratorConfig(fsdp=FSDPConfig(cpu_offload=True)), optimizer_states=2
        ).memory
        res["offload"]["estimate"] = {
            "params": est.params,
            "grads": est.grads,
            "optimizer": est.optimizer,
            "unsharded_total": est.unsharded_total,
            "location": est.location,
        }

        # A real policy: LeRobot's ACT (test size) under FSDP2 in fp32 and with the derived bf16 policy.
        res["act"] = train_act(rt, batch_size=2, steps=3)
        res["act_bf16"] = train_act(rt, batch_size=2, steps=3, mixed_precision="bf16")

        # Tied weights inside one unit (the root) are fine: the tie survives sharding and trains.
        tied = TiedTokenModel()
        only_blocks = AcceleratorConfig(fsdp=FSDPConfig(wrap_modules=("Block",)))
        tied = wrap_model(tied, rt, build_plan(tied, rt, only_blocks)).model
        loss, _ = tied({"tokens": torch.arange(8).reshape(2, 4) % 11})
        loss.backward()
        res["tied_in_root"] = {
            "same_object": tied.head.proj.weight is tied.embed.weight,
            "type": type(tied.embed.weight).__name__,
            "loss": float(loss.detach()),
            "grad_full_shape": list(full(tied.embed.weight.grad).shape),
        }

    # The README's foreign-trainer example, as written, in a second session of the same processes.
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(readme_fsdp_example(), str(README), "exec"), {"__name__": "__main__"})  # noqa: S102
    res["readme_example"] = printed.getvalue()
    write_json(out_path(f"rank{rank()}.json"), res)


if __name__ == "__main__":
    main()
