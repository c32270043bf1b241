"""Host syncs and agreement under DDP x2 (run inside engine_checks.py's launch, no launch of its own).

* ``ddp_syncs``: a real DDP TrainLoop (K=2, clipping) with an every-step no-read hook, a log hook every
  12 steps and lerobot-train's interrupt watch: every tensor read and collective counted per loop step
  (``HostSyncCounter``). Besides DDP's own gradient all-reduce (issued by its C++ reducer, so not a
  Python call), a non-log step may only start the interrupt flag's async all-reduce. Rank 1 "receives"
  a signal during step 14: the flag started at 14 is agreed at 15, inside a K=2 window, so both ranks
  stop after step 16.
* ``nan_rank1``: a NaN loss at step 3 on rank 1 only: both ranks raise at the log step 4, naming rank 1
  and step 3.
"""

from __future__ import annotations

import signal

import torch
from _workload import DATA_SEED, MODEL_SEED, NUM_SAMPLES
from lerobot_cli.interrupt import InterruptWatch, TrainingInterrupted
from lerobot_parallel import AcceleratorConfig, GradientAccumulationConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop import NonFiniteLossError, ShardedBatchSampler, TrainLoop
from lerobot_trainloop.testing import HostSyncCounter, SyntheticRegression, TinyRegressor


class NaNOnRank(TinyRegressor):
    def __init__(self, rank: int, bad_call: int):
        super().__init__(seed=MODEL_SEED)
        self.rank, self.calls, self.bad_call = rank, 0, bad_call

    def forward(self, batch):
        loss, info = super().forward(batch)
        self.calls += 1
        return (loss * float("nan") if (self.rank, self.calls) == (1, self.bad_call) else loss), info


def _loop(rt, model, k: int = 2) -> tuple[TrainLoop, list]:
    ds = SyntheticRegression(NUM_SAMPLES, seed=DATA_SEED)
    sampler = ShardedBatchSampler(
        len(ds), 2, dp_rank=rt.dp_rank, dp_world_size=rt.dp_world_size, seed=0, max_batches=40
    )
    acc = AcceleratorConfig(gradient_accumulation=GradientAccumulationConfig(k))
    wrapped = wrap_model(model, rt, build_plan(model, rt, acc))
    loop = TrainLoop(
        wrapped, torch.optim.SGD(wrapped.model.parameters(), lr=0.05), accelerator=acc, grad_clip_norm=1.0
    )
    return loop, [ds.batch(ix) for ix in sampler]


def ddp_syncs(rt) -> dict:
    loop, data = _loop(rt, TinyRegressor(seed=MODEL_SEED))
    watch = InterruptWatch(rt.device, True, rt.timeout_s)
    logged: list[float] = []

    def interrupt(e) -> None:
        if rt.rank == 1 and e.step == 14:
            watch.signum = signal.SIGTERM  # what the signal handler does
        watch.check(defer=not loop.at_window_boundary)

    loop.add_hook(lambda e: None, every=1, check_finite=False)
    loop.add_hook(lambda e: logged.append(e.metrics["loss"]), every=12, metrics=True)
    loop.add_hook(interrupt, every=1, check_finite=False)
    stopped = None
    with HostSyncCounter(label=lambda: loop.step) as counter:
        try:
            loop.run(data, 40)
        except TrainingInterrupted as exc:
            stopped = {"step": loop.step, "signal": exc.signum}
    return {
        "blocking": {s: counter.syncs(s) for s in range(loop.step + 1)},
        "async": {
            s: [n for kind, n, lab in counter.events if kind == "async" and lab == s]
            for s in range(loop.step + 1)
        },
        "stopped": stopped,
        "logged": logged,
        "model_type": type(loop.model).__name__,
    }


def nan_rank1(rt) -> dict:
    loop, data = _loop(rt, NaNOnRank(rt.rank, 3), k=1)
    loop.add_hook(lambda e: None, every=4, metrics=True)
    try:
        loop.run(data, 8)
    except NonFiniteLossError as exc:
        return {"error": str(exc), "step": loop.step}
    return {"error": None, "step": loop.step}
