"""One training run on the tiny workload, shared by the launched ranks and the in-process
single-process reference, so both sides run literally the same code."""

from __future__ import annotations

import torch
from lerobot_parallel import AcceleratorConfig, GradientAccumulationConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop import ShardedBatchSampler, TrainLoop
from lerobot_trainloop.testing import SyntheticRegression, TinyRegressor

NUM_SAMPLES = 64
DATA_SEED, MODEL_SEED, SAMPLER_SEED = 1, 2, 3
LR = 0.05


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """The model's parameters as one vector (DDP's are its module's, in the same order)."""
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def train(
    runtime: ParallelRuntime,
    batch_size: int,
    grad_accum: int,
    steps: int,
    mixed_precision: str = "no",
    on_step=None,
    scheduler: bool = False,
    **precision_kwargs,
) -> dict:
    """Train ``steps`` loop steps with SGD; returns reduced per-step losses and final params.

    ``on_step(loop, output)`` runs after every step on every rank (for cross-rank probes).
    """
    ds = SyntheticRegression(NUM_SAMPLES, seed=DATA_SEED)
    sampler = ShardedBatchSampler(
        len(ds), batch_size, dp_rank=runtime.dp_rank, dp_world_size=runtime.dp_world_size, seed=SAMPLER_SEED
    )
    acc = AcceleratorConfig(
        mixed_precision=mixed_precision, gradient_accumulation=GradientAccumulationConfig(grad_accum)
    )
    model = TinyRegressor(seed=MODEL_SEED)
    wrapped = wrap_model(model, runtime, build_plan(model, runtime, acc))
    model = wrapped.model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9) if scheduler else None
    precision = None
    if precision_kwargs:
        from lerobot_parallel.precision import build_precision

        precision = build_precision(mixed_precision, runtime.device, **precision_kwargs)
    loop = TrainLoop(wrapped, opt, accelerator=acc, sampler=sampler, scheduler=sched, precision=precision)
    computed: set[str] = set()  # what the layers really compute in (autocast is invisible in param dtypes)
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.register_forward_hook(lambda _m, _i, out: computed.add(str(out.dtype)))
    losses: list[float] = []
    outputs: list[dict] = []
    loop.add_hook(lambda e: losses.append(e.metrics["loss"]), every=1, metrics=True)
    if on_step is not None:
        loop.add_hook(lambda e: on_step(e.loop, e.output), every=1)
    loop.add_hook(
        lambda e: outputs.append(
            {
                "step": e.output.step,
                "synced": e.output.synced,
                "stepped": e.output.optimizer_stepped,
                "skipped": e.output.skipped,
                "lr": e.output.lr,
            }
        ),
        every=1,
    )
    loop.run((ds.batch(ix) for ix in sampler), steps)
    return {
        "losses": losses,
        "outputs": outputs,
        "params": flat_params(model).tolist(),
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "linear_output_dtypes": sorted(computed),
        "sampler": sampler.state_dict(),
        "optimizer_steps": loop.optimizer_steps,
        "skipped_updates": loop.skipped_updates,
    }
