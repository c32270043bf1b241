"""Activation checkpointing (and compile) inside a multi-process launch, for whatever layout the caller's
runtime is (DDP, FSDP2, HSDP): one function the layout launches share.

Each dp rank trains on its own slice of one global batch; the gradients (gathered to full tensors under
FSDP) of the checkpointed and compiled runs are compared with the plain run of the same layout, on the
rank, and only the largest differences travel back to pytest. Equal gradients alone would not show that
checkpointing is applied (a no-op passes), so each run also reports what checkpointing changes: the
bytes autograd saved for backward, and every call of a block's method, in forward or in backward (a
recomputation), with whether the block's parameters (and its partner's, for a joint method) were
gathered at that moment: under FSDP a recomputation runs after the pre-backward all-gather of the
unit, which the parameters being plain tensors there (DTensor shards between forward and backward)
shows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch._dynamo
from lerobot_parallel import AcceleratorConfig
from lerobot_parallel.config import ActivationCheckpointingConfig, CompileConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.testing import Block, BlockRegressor, JointTowers, MainTowerLayer, saved_tensor_bytes
from lerobot_parallel.wrap import wrap_model
from torch.distributed.tensor import DTensor

GLOBAL_BATCH = 8
DEPTH = {"blocks": 4, "joint": 3}  # the blocks of each case's model, as regions_check builds them


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def params_gathered(module: torch.nn.Module) -> bool:
    """All of ``module``'s own parameters are whole tensors now (FSDP: unsharded), none a DTensor shard."""
    return not any(isinstance(p, DTensor) for p in module.parameters())


@contextlib.contextmanager
def block_calls(cls: type, method: str) -> Iterator[dict]:
    """Record each call of ``cls.method`` made while active (build and wrap the model inside: FSDP binds a
    registered forward method when it wraps) as ``{"phase", "gathered"}``: ``phase`` is ``calls["phase"]``
    at that moment (the caller sets it to ``backward`` before ``backward()``); ``gathered`` covers the
    block and, for a joint method, the partner module it is handed first.
    ``calls["resharded_before_backward"]`` is the caller's to fill."""
    real = getattr(cls, method)
    calls: dict = {"phase": "forward", "calls": []}

    def recorded(self, *args, **kwargs):
        modules = [self, *(a for a in args[:1] if isinstance(a, torch.nn.Module))]
        calls["calls"].append({"phase": calls["phase"], "gathered": all(params_gathered(m) for m in modules)})
        return real(self, *args, **kwargs)

    setattr(cls, method, recorded)
    try:
        yield calls
    finally:
        setattr(cls, method, real)


def summarize(calls: dict) -> dict:
    """Counts of ``block_calls``'s record: forward and backward calls, the backward ones whose parameters
    were gathered, and whether every block's parameters were shards again between forward and backward."""
    backward = [c for c in calls["calls"] if c["phase"] == "backward"]
    return {
        "forward_calls": sum(c["phase"] == "forward" for c in calls["calls"]),
        "backward_calls": len(backward),
        "backward_gathered": sum(c["gathered"] for c in backward),
        "resharded_before_backward": calls.get("resharded_before_backward"),
    }


def _grads(
    rt, model_fn, batch_fn, accelerator: AcceleratorConfig, record: tuple[type, str] | None = None
) -> tuple[torch.Tensor, list[str], dict]:
    """Flat full gradients, the regions' description and (with ``record``: the block class and method)
    the saved bytes and the block calls of one forward and backward."""
    facts: dict = {}
    # recording from before the wrap: FSDP registers a joint method as the unit's forward by binding it then
    with block_calls(*record) if record else contextlib.nullcontext({}) as calls:
        model = model_fn()
        plan = build_plan(model, rt, accelerator)
        wrapped = wrap_model(model, rt, plan)
        (loss, _), facts["saved_bytes"] = saved_tensor_bytes(lambda: wrapped.model(batch_fn()))
        blocks = [m for m in wrapped.model.modules() if record and isinstance(m, record[0])]
        calls["resharded_before_backward"] = all(not params_gathered(b) for b in blocks)
        calls["phase"] = "backward"
        loss.backward()
    if record:
        facts.update(summarize(calls))
    flat = torch.cat([_full(p.grad).flatten() for p in wrapped.model.parameters()])
    return flat, plan.describe_regions(), facts


def regions_check(rt, compile_backend: str | None = None) -> dict:
    """Max |grad difference| of full / selective checkpointing (and compile, when a backend is given) vs
    no checkpointing, for the block model and the grouped joint towers; the regions' description; and, for
    the plain and checkpointed eager runs, the bytes saved for backward and the block calls (see
    ``_grads``)."""
    per = GLOBAL_BATCH // rt.dp_world_size
    rows = slice(rt.dp_rank * per, (rt.dp_rank + 1) * per)
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g)
    joint = JointTowers.batch(GLOBAL_BATCH, seed=4)
    cases = {
        "blocks": (
            lambda: BlockRegressor(depth=DEPTH["blocks"]),
            lambda: {"x": x[rows], "y": y[rows]},
            (Block, "forward"),
        ),
        "joint": (
            lambda: JointTowers(depth=DEPTH["joint"]),
            lambda: {k: v[rows] for k, v in joint.items()},
            (MainTowerLayer, "joint"),
        ),
    }
    variants = {
        mode: AcceleratorConfig(activation_checkpointing=ActivationCheckpointingConfig(mode))
        for mode in ("full", "selective")
    }
    if compile_backend is not None:
        variants["compiled_full"] = AcceleratorConfig(
            activation_checkpointing=ActivationCheckpointingConfig("full"),
            compile=CompileConfig(enabled=True, backend=compile_backend),
        )
    out: dict = {}
    for case, (model_fn, batch_fn, record) in cases.items():
        plain, _, facts = _grads(rt, model_fn, batch_fn, AcceleratorConfig(), record)
        out[case] = {"grad_abs_max": float(plain.abs().max()), "plain_facts": facts}
        for name, acc in variants.items():
            if acc.compile.enabled and case == "blocks":
                continue  # the block model's probe (a dict write) keeps dynamo out of a checkpointed block
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            # the compiled run is not recorded: a recording wrapper would be a side effect inside the graph
            grads, regions, facts = _grads(
                rt, model_fn, batch_fn, acc, None if acc.compile.enabled else record
            )
            out[case][name] = float((grads - plain).abs().max())
            out[case][f"{name}_regions"] = regions
            out[case][f"{name}_graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
            if facts:
                out[case][f"{name}_facts"] = facts
    return out


def assert_applied(case: str, got: dict, sharded: bool) -> None:
    """What the test side asserts of ``regions_check(...)[case]``: without checkpointing no block runs in
    backward; with full and selective each block runs once in forward and once more in backward (its
    recomputation) with its parameters gathered, and autograd keeps fewer bytes (full: the block inputs
    only; selective: also the matmul outputs). ``sharded``: every block was a shard again between forward
    and backward, so the recomputation followed FSDP's pre-backward all-gather."""
    depth, plain = DEPTH[case], got["plain_facts"]
    assert plain["forward_calls"] == depth and plain["backward_calls"] == 0, (case, plain)
    for mode, ratio in (("full", 0.25), ("selective", 0.75)):
        facts = got[f"{mode}_facts"]
        assert facts["forward_calls"] == facts["backward_calls"] == facts["backward_gathered"] == depth, (
            case,
            mode,
            facts,
        )
        assert facts["saved_bytes"] < ratio * plain["saved_bytes"], (case, mode, facts, plain)
        assert facts["resharded_before_backward"] is sharded, (case, mode, facts)
