"""Run under ``torchrun --nproc-per-node=2``: inference on a tiny FastWAM sharded by FSDP2 (dp_shard=2, gloo).

The policy is planned as lerobot-train plans it (its spec's ``MoTLayer`` units and no-forward classes) and
wrapped by ``wrap_model``. Each rank feeds its own observations (``live_batch(10 + rank)``, the same batch
size on both ranks) and writes ``rank<r>.json`` into argv[1]: which methods FSDP registered on which module,
the action chunk right after wrapping, after a training forward and backward (FSDP reshards the root after
backward), the first actions ``select_action`` pops, and whether the units are shards again afterwards. The
test compares the actions with the same weights unsharded on one process (tests/test_fastwam_inference.py).
"""

from __future__ import annotations

import types

from _common import arm_watchdog, out_path, rank, write_json

arm_watchdog(120)

import torch
from fastwam_tiny import live_batch, tiny_fastwam, training_batch
from lerobot_cli.policies.fastwam.mot import MoTLayer
from lerobot_cli.policies.registry import spec_of
from lerobot_parallel import ParallelismConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.teardown import parallel_session
from lerobot_parallel.wrap import wrap_model
from torch.distributed.tensor import DTensor

SELECT_CALLS = 4  # n_action_steps=3: one refill


def registered_methods(model: torch.nn.Module) -> dict[str, list[str]]:
    """``{module path ("" = root): [method names]}`` that ``register_fsdp_forward_method`` patched on the
    instance (a bound method in the instance's ``__dict__`` wrapping the class's)."""
    out = {}
    for path, module in model.named_modules():
        names = [
            name
            for name, value in vars(module).items()
            if isinstance(value, types.MethodType) and hasattr(value.__func__, "__wrapped__")
        ]
        if names:
            out[path] = sorted(names)
    return out


def sharded(params) -> bool:
    """Every parameter a DTensor shard (FSDP2 swaps in plain tensors while a unit is gathered)."""
    params = list(params)
    return bool(params) and all(isinstance(p, DTensor) for p in params)


def main() -> None:
    res: dict = {}
    with parallel_session(ParallelismConfig(dp_shard=2), device="cpu") as rt:
        policy = tiny_fastwam()
        spec = spec_of(policy.config)
        plan = build_plan(
            policy,
            rt,
            default_wrap_modules=list(spec.wrap_units or ()),
            default_unit_groups=list(spec.unit_groups),
            default_no_forward_modules=list(spec.no_forward_modules),
        )
        model = wrap_model(policy, rt, plan).model
        layers = [m for m in model.modules() if isinstance(m, MoTLayer)]

        def units_sharded() -> bool:  # read now: FSDP2 swaps the module's parameters when it gathers
            return sharded(p for m in layers for p in m.parameters())

        def root_sharded() -> bool:  # the root's own parameters, those no unit took
            in_units = {id(p) for m in layers for p in m.parameters()}
            return sharded(p for p in model.parameters() if id(p) not in in_units)

        res["units"] = [u.label for u in plan.units]
        res["registered"] = registered_methods(model)
        res["all_sharded"] = sharded(model.parameters())
        batch = live_batch(10 + rank())

        res["fresh"] = model.predict_action_chunk(batch).tolist()
        res["layers_resharded"] = units_sharded()
        res["root_sharded_after_inference"] = root_sharded()  # torch keeps a root gathered after forward

        model.train()
        loss, _ = model(training_batch(20 + rank()))
        loss.backward()
        res["root_sharded_after_backward"] = root_sharded()
        res["after_train"] = model.predict_action_chunk(batch).tolist()

        model.reset()
        res["select_action"] = [model.select_action(batch).tolist() for _ in range(SELECT_CALLS)]
        res["layers_resharded_after_select"] = units_sharded()
        res["root_sharded_after_select"] = root_sharded()  # gathered: pops run no collective
    write_json(out_path(f"rank{rank()}.json"), res)


if __name__ == "__main__":
    main()
