"""One training run of ``BlockRegressor`` through ``wrap_model`` + ``TrainLoop``, shared by the
launched FSDP/HSDP ranks and the in-process single-process reference, so both sides run
literally the same code (only the runtime differs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

import torch
import torch.distributed as dist
from lerobot_parallel import AcceleratorConfig, FSDPConfig, GradientAccumulationConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.precision import build_precision
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.testing import BlockRegressor
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop import ShardedBatchSampler, TrainLoop
from lerobot_trainloop.testing import SyntheticRegression
from torch.distributed.tensor import DTensor

NUM_SAMPLES = 64
DATA_SEED, MODEL_SEED, SAMPLER_SEED = 1, 2, 3
LR = 0.05


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (a collective for DTensors: call it on all ranks alike)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def flat_full_params(model: torch.nn.Module) -> list[float]:
    return torch.cat([full(p.detach()).float().flatten() for p in model.parameters()]).tolist()


class CollectiveSpy:
    """Counts the reduce-scatters (with their dtypes) and all-reduces FSDP issues, by wrapping
    ``dist.reduce_scatter_single`` and ``dist.all_reduce``, which FSDP2's default communication
    looks up at call time (torch 2.15)."""

    def __init__(self) -> None:
        self.calls: list[str] = []  # reduce-scatter input dtypes
        self.all_reduces = 0
        self._real: tuple = ()

    def clear(self) -> None:
        self.calls.clear()
        self.all_reduces = 0

    def __enter__(self) -> Self:
        rs, ar = self._real = (dist.reduce_scatter_single, dist.all_reduce)

        def spy_rs(*args, **kwargs):
            tensor = kwargs.get("input", args[1] if len(args) > 1 else None)
            self.calls.append(str(tensor.dtype))
            return rs(*args, **kwargs)

        def spy_ar(*args, **kwargs):
            self.all_reduces += 1
            return ar(*args, **kwargs)

        dist.reduce_scatter_single, dist.all_reduce = spy_rs, spy_ar
        return self

    def __exit__(self, *exc) -> None:
        dist.reduce_scatter_single, dist.all_reduce = self._real


def train(
    runtime: ParallelRuntime,
    *,
    batch_size: int,
    steps: int,
    grad_accum: int = 1,
    mixed_precision: str = "no",
    fsdp: FSDPConfig | None = None,
    optimizer: str = "sgd",
    grad_clip_norm: float | None = None,
    scheduler: bool = False,
    model_factory: Callable[..., torch.nn.Module] = BlockRegressor,
    on_step: Callable | None = None,
    on_wrapped: Callable | None = None,
    **scaler_kwargs,
) -> dict:
    """Train ``steps`` loop steps; returns reduced losses, per-step outputs and the full final params."""
    fsdp = fsdp or FSDPConfig()
    ds = SyntheticRegression(NUM_SAMPLES, seed=DATA_SEED)
    sampler = ShardedBatchSampler(
        len(ds), batch_size, dp_rank=runtime.dp_rank, dp_world_size=runtime.dp_world_size, seed=SAMPLER_SEED
    )
    acc = AcceleratorConfig(
        mixed_precision=mixed_precision,
        fsdp=fsdp,
        gradient_accumulation=GradientAccumulationConfig(grad_accum),
    )
    model = model_factory(seed=MODEL_SEED)
    wrapped = wrap_model(model, runtime, build_plan(model, runtime, acc))
    model = wrapped.model
    if on_wrapped is not None:
        on_wrapped(model)
    opt = (
        torch.optim.AdamW(model.parameters(), lr=0.01)
        if optimizer == "adamw"
        else torch.optim.SGD(model.parameters(), lr=LR)
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9) if scheduler else None
    precision = build_precision(mixed_precision, runtime.device, **scaler_kwargs) if scaler_kwargs else None
    loop = TrainLoop(
        wrapped,
        opt,
        accelerator=acc,
        sampler=sampler,
        scheduler=sched,
        precision=precision,
        grad_clip_norm=grad_clip_norm,
    )
    losses: list[float] = []
    outputs: list[dict] = []
    loop.add_hook(lambda e: losses.append(e.metrics["loss"]), every=1, metrics=True)

    def as_float(value):  # StepOutput's norm is a 0-d device tensor (or None without clipping)
        return None if value is None else float(value)

    loop.add_hook(
        lambda e: outputs.append(
            {
                "synced": e.output.synced,
                "skipped": e.output.skipped,
                "grad_norm": as_float(e.output.grad_norm),
                "lr": e.output.lr,
            }
        ),
        every=1,
    )
    if on_step is not None:
        loop.add_hook(lambda e: on_step(loop, e.output), every=1)
    loop.run((ds.batch(ix) for ix in sampler), steps)
    return {
        "losses": losses,
        "outputs": outputs,
        "params": flat_full_params(model),
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "param_types": sorted({type(p).__name__ for p in model.parameters()}),
        "optimizer_steps": loop.optimizer_steps,
        "skipped_updates": loop.skipped_updates,
        "probe": {k: str(v) for k, v in getattr(model, "probe", {}).items()},
        "model": model,
        "optimizer": opt,
    }


class ACTData:
    """Fixed random ACT samples (state, env state, action chunk) addressed by index; no camera, so no
    ResNet backbone: its 11M parameters would dominate a CPU test without exercising anything new."""

    def __init__(self, num_samples: int = 32, chunk: int = 5, seed: int = DATA_SEED) -> None:
        g = torch.Generator().manual_seed(seed)
        self.tensors = {
            "observation.state": torch.randn(num_samples, 4, generator=g),
            "observation.environment_state": torch.randn(num_samples, 3, generator=g),
            "action": torch.randn(num_samples, chunk, 2, generator=g),
            "action_is_pad": torch.zeros(num_samples, chunk, dtype=torch.bool),
        }

    def __len__(self) -> int:
        return self.tensors["action"].shape[0]

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(indices)
        return {k: v[idx] for k, v in self.tensors.items()}


def small_act(seed: int = MODEL_SEED) -> torch.nn.Module:
    """LeRobot's ACT (from lerobot_cli) at test size, deterministic: no dropout, no VAE sampling."""
    from lerobot_cli.features import PolicyFeature
    from lerobot_cli.policies.act.config import ACTConfig
    from lerobot_cli.policies.act.modeling import ACTPolicy

    cfg = ACTConfig(
        input_features={
            "observation.state": PolicyFeature("STATE", (4,)),
            "observation.environment_state": PolicyFeature("ENV", (3,)),
        },
        output_features={"action": PolicyFeature("ACTION", (2,))},
        chunk_size=5,
        n_action_steps=5,
        dim_model=32,
        n_heads=4,
        dim_feedforward=64,
        n_encoder_layers=2,
        n_decoder_layers=1,
        use_vae=False,
        dropout=0.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ACTPolicy(cfg)


def train_act(runtime: ParallelRuntime, *, batch_size: int, steps: int, mixed_precision: str = "no") -> dict:
    """ACT through the same engine and loop (SGD: Adam's normalisation would amplify float noise in
    near-zero gradients into visible parameter differences; clipping at 10 like LeRobot's preset)."""
    ds = ACTData()
    sampler = ShardedBatchSampler(
        len(ds), batch_size, dp_rank=runtime.dp_rank, dp_world_size=runtime.dp_world_size, seed=SAMPLER_SEED
    )
    acc = AcceleratorConfig(mixed_precision=mixed_precision)
    policy = small_act()
    wrapped = wrap_model(policy, runtime, build_plan(policy, runtime, acc))
    model = wrapped.model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loop = TrainLoop(wrapped, opt, accelerator=acc, sampler=sampler, grad_clip_norm=10.0)
    losses: list[float] = []
    loop.add_hook(lambda e: losses.append(e.metrics["loss"]), every=1, metrics=True)
    loop.run((ds.batch(ix) for ix in sampler), steps)
    return {
        "losses": losses,
        "params": flat_full_params(model),
        "param_types": sorted({type(p).__name__ for p in model.parameters()}),
    }


def accumulation_trace(runtime: ParallelRuntime, **train_kwargs) -> dict:
    """``train(...)`` (JSON-ready) plus, per loop step, whether it synchronised and how many
    reduce-scatters and all-reduces it issued: what gradient accumulation must skip."""
    per_step: list[dict] = []
    with CollectiveSpy() as spy:

        def count(loop, out) -> None:
            per_step.append(
                {"synced": out.synced, "reduce_scatters": len(spy.calls), "all_reduces": spy.all_reduces}
            )
            spy.clear()

        result = json_ready(train(runtime, on_step=count, **train_kwargs))
    result["per_step"] = per_step
    return result


def json_ready(result: dict) -> dict:
    """``train``'s result without the live objects."""
    return {k: v for k, v in result.items() if k not in ("model", "optimizer")}
