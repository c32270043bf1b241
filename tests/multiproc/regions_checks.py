"""Activation checkpointing (and compile) inside a multi-process launch, for whatever layout the caller's
runtime is (DDP, FSDP2, HSDP): one function the layout launches share.

Each dp rank trains on its own slice of one global batch; the gradients (gathered to full tensors under
FSDP) of the checkpointed and compiled runs are compared with the plain run of the same layout, on the
rank, and only the largest differences travel back to pytest.
"""

from __future__ import annotations

import torch
import torch._dynamo
from lerobot_parallel import AcceleratorConfig
from lerobot_parallel.config import ActivationCheckpointingConfig, CompileConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.testing import BlockRegressor, JointTowers
from lerobot_parallel.wrap import wrap_model
from torch.distributed.tensor import DTensor

GLOBAL_BATCH = 8


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _grads(rt, model_fn, batch_fn, accelerator: AcceleratorConfig) -> tuple[torch.Tensor, list[str]]:
    model = model_fn()
    plan = build_plan(model, rt, accelerator)
    wrapped = wrap_model(model, rt, plan)
    loss, _ = wrapped.model(batch_fn())
    loss.backward()
    flat = torch.cat([_full(p.grad).flatten() for p in wrapped.model.parameters()])
    return flat, plan.describe_regions()


def regions_check(rt, compile_backend: str | None = None) -> dict:
    """Max |grad difference| of full / selective checkpointing (and compile, when a backend is given) vs
    no checkpointing, for the block model and the grouped joint towers; plus the regions' description."""
    per = GLOBAL_BATCH // rt.dp_world_size
    rows = slice(rt.dp_rank * per, (rt.dp_rank + 1) * per)
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g)
    joint = JointTowers.batch(GLOBAL_BATCH, seed=4)
    cases = {
        "blocks": (lambda: BlockRegressor(depth=4), lambda: {"x": x[rows], "y": y[rows]}),
        "joint": (lambda: JointTowers(depth=3), lambda: {k: v[rows] for k, v in joint.items()}),
    }
    variants = {mode: AcceleratorConfig(activation_checkpointing=ActivationCheckpointingConfig(mode))
                for mode in ("full", "selective")}
    if compile_backend is not None:
        variants["compiled_full"] = AcceleratorConfig(
            activation_checkpointing=ActivationCheckpointingConfig("full"),
            compile=CompileConfig(enabled=True, backend=compile_backend))
    out: dict = {}
    for case, (model_fn, batch_fn) in cases.items():
        plain, _ = _grads(rt, model_fn, batch_fn, AcceleratorConfig())
        out[case] = {"grad_abs_max": float(plain.abs().max())}
        for name, acc in variants.items():
            if acc.compile.enabled and case == "blocks":
                continue  # the block model's probe (a dict write) keeps dynamo out of a checkpointed block
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            grads, regions = _grads(rt, model_fn, batch_fn, acc)
            out[case][name] = float((grads - plain).abs().max())
            out[case][f"{name}_regions"] = regions
            out[case][f"{name}_graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    return out
