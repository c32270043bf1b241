"""The step loop in one process: accumulation equivalence, scheduler and fp16-skip rules,
clipping, non-finite losses, hooks and state. Multi-process equivalence: tests/test_engine_multiproc.py."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.distributed as dist
from lerobot_parallel import AcceleratorConfig, GradientAccumulationConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.precision import build_precision
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop import NonFiniteLossError, ShardedBatchSampler, TrainLoop
from lerobot_trainloop.testing import SyntheticRegression, TinyRegressor

RT = ParallelRuntime.single("cpu")


def wrapped(model):
    return wrap_model(model, RT, build_plan(model, RT))


def acc(k=1, mp="no"):
    return AcceleratorConfig(mixed_precision=mp, gradient_accumulation=GradientAccumulationConfig(k))


def params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def run(
    batch_size,
    k,
    steps,
    *,
    lr=0.05,
    clip=None,
    scheduler=False,
    mp="no",
    precision=None,
    model=None,
    allow_nonfinite=False,
    seed=0,
):
    ds = SyntheticRegression(64, seed=1)
    sampler = ShardedBatchSampler(len(ds), batch_size, seed=seed)
    model = model or TinyRegressor(seed=2)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5) if scheduler else None
    loop = TrainLoop(
        wrapped(model),
        opt,
        scheduler=sched,
        accelerator=acc(k, mp),
        grad_clip_norm=clip,
        sampler=sampler,
        precision=precision,
        allow_nonfinite_loss=allow_nonfinite,
    )
    outs = []
    loop.add_hook(lambda e: outs.append(e.output), every=1)
    loop.run((ds.batch(ix) for ix in sampler), steps)
    return loop, outs, sched


def test_accumulation_equals_the_big_batch():
    """1 process: B=4, K=2 over 6 loop steps == B=8, K=1 over 3 loop steps."""
    small, small_outs, _ = run(4, 2, 6)
    big, big_outs, _ = run(8, 1, 3)
    assert torch.allclose(params(small.model), params(big.model), atol=1e-6, rtol=0)
    assert small.optimizer_steps == big.optimizer_steps == 3
    for j, out in enumerate(big_outs):  # same parameters inside a window: mean of the halves == big loss
        halves = (small_outs[2 * j].loss + small_outs[2 * j + 1].loss) / 2
        assert abs(halves - out.loss) < 1e-5
    assert [o.synced for o in small_outs] == [False, True] * 3


def test_without_accumulation_the_runs_differ():
    # guards the test above against passing vacuously (e.g. if K were ignored)
    a, _, _ = run(4, 1, 6)
    b, _, _ = run(8, 1, 3)
    assert not torch.allclose(params(a.model), params(b.model), atol=1e-4)


def test_scheduler_steps_once_per_loop_step_not_per_update(recwarn):
    loop, outs, sched = run(4, 2, 6, scheduler=True)
    assert sched.last_epoch == 6 and loop.optimizer_steps == 3
    assert [o.lr for o in outs] == pytest.approx([0.05 * 0.5 ** (i + 1) for i in range(6)])
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]


def test_fp16_skipped_update_also_skips_the_scheduler():
    precision = build_precision("fp16", "cpu", init_scale=2.0**40, backoff_factor=2.0**-32)
    model = TinyRegressor(seed=2)
    before = params(model).clone()
    loop, outs, sched = run(8, 1, 3, scheduler=True, mp="fp16", precision=precision, model=model)
    assert [o.skipped for o in outs] == [True, False, False]
    assert [o.optimizer_stepped for o in outs] == [False, True, True]
    assert sched.last_epoch == 2 and loop.skipped_updates == 1 and loop.optimizer_steps == 2
    assert [o.lr for o in outs] == pytest.approx([0.05, 0.025, 0.0125])
    assert not torch.equal(before, params(model))


def test_bf16_loop_trains_with_fp32_parameters():
    loop, outs, _ = run(8, 1, 4, mp="bf16")
    assert all(p.dtype == torch.float32 for p in loop.model.parameters())
    assert all(math.isfinite(o.loss) for o in outs) and outs[-1].loss < outs[0].loss
    assert loop.precision.autocast_dtype == torch.bfloat16


def test_clipping_limits_the_update_and_reports_the_raw_norm():
    model = TinyRegressor(seed=2)
    before = params(model).clone()
    _, outs, _ = run(8, 1, 1, lr=1.0, clip=0.01, model=model)
    assert outs[0].grad_norm > 0.01  # the norm before clipping
    assert (params(model) - before).norm().item() == pytest.approx(0.01, rel=1e-4)


class NaNAt(TinyRegressor):
    def __init__(self, bad_call):
        super().__init__(seed=2)
        self.calls, self.bad_call = 0, bad_call

    def forward(self, batch):
        loss, info = super().forward(batch)
        self.calls += 1
        return (loss * float("nan") if self.calls == self.bad_call else loss), info


def test_non_finite_loss_stops_with_rank_and_step():
    with pytest.raises(NonFiniteLossError, match=r"rank 0: loss is nan at loop step 3"):
        run(8, 1, 5, model=NaNAt(3))


def test_non_finite_loss_allowed_continues(caplog):
    with caplog.at_level(logging.WARNING, logger="lerobot_trainloop.loop"):
        loop, outs, _ = run(8, 1, 4, model=NaNAt(2), allow_nonfinite=True)
    assert loop.step == 4 and math.isnan(outs[1].loss)
    assert "loss is nan at loop step 2" in caplog.text


def test_hooks_schedule_and_metrics_window():
    ds = SyntheticRegression(64, seed=1)
    sampler = ShardedBatchSampler(len(ds), 8)
    model = TinyRegressor()
    loop = TrainLoop(
        wrapped(model), torch.optim.SGD(model.parameters(), lr=0.01), sampler=sampler, grad_clip_norm=10.0
    )
    logged, saved = [], []
    loop.add_hook(lambda e: logged.append((e.step, e.metrics)), every=3, metrics=True)
    loop.add_hook(lambda e: saved.append((e.step, e.metrics, sampler.state_dict()["offset"])), at=[2, 7])
    assert not dist.is_initialized()  # so any collective attempted in world 1 would raise
    loop.run((ds.batch(ix) for ix in sampler), 7)
    assert [s for s, _ in logged] == [3, 6]
    assert [(s, m) for s, m, _ in saved] == [(2, None), (7, None)]
    assert [off for _, _, off in saved] == [16, 56]  # the sampler counts the step a hook sees
    m = logged[0][1]
    assert {
        "loss",
        "mse",
        "l1",
        "data_s",
        "step_s",
        "update_s",
        "samples",
        "lr",
        "grad_norm",
        "samples_per_s",
    } <= set(m)
    assert m["samples"] == 8 and m["samples_per_s"] == pytest.approx(8 / m["step_s"])
    assert m["lr"] == 0.01 and m["mse"] == pytest.approx(m["loss"])


def test_run_reiterates_finite_data_and_rejects_empty():
    ds = SyntheticRegression(16, seed=1)
    model = TinyRegressor()
    loop = TrainLoop(wrapped(model), torch.optim.SGD(model.parameters(), lr=0.01))
    loop.run([ds.batch([0, 1]), ds.batch([2, 3])], 5)
    assert loop.step == 5
    with pytest.raises(RuntimeError, match="yielded no batch"):
        loop.run([], 6)


def test_state_round_trip_at_a_window_boundary():
    loop, _, _ = run(4, 2, 4)
    state = loop.state_dict()
    assert state == {
        "step": 4,
        "optimizer_steps": 2,
        "skipped_updates": 0,
        "grad_accum_steps": 2,
        "accumulated": 0,
    }
    fresh = TrainLoop(
        wrapped(TinyRegressor()), torch.optim.SGD(TinyRegressor().parameters(), lr=0.1), accelerator=acc(2)
    )
    assert fresh.load_state_dict(state) == []
    assert fresh.state_dict() == state
    assert not fresh.is_sync_step() and fresh.is_sync_step(6)


def test_state_saved_inside_a_window_restarts_a_full_window_and_says_what_was_lost(caplog):
    loop, _, _ = run(4, 2, 3)
    state = loop.state_dict()
    assert (state["step"], state["optimizer_steps"], state["accumulated"]) == (3, 1, 1)
    fresh = TrainLoop(
        wrapped(TinyRegressor()), torch.optim.SGD(TinyRegressor().parameters(), lr=0.1), accelerator=acc(2)
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        notes = fresh.load_state_dict(state)
    assert caplog.text == ""  # the caller says it, once
    assert len(notes) == 2 and "inside a 2-step gradient-accumulation window" in notes[0]
    assert "last 1 micro-batch(es) (steps 3-3) were not saved" in notes[0]
    assert (
        "the first update after the resume (at step 4) uses the 1 micro-batch(es) of steps 4-4, not 2"
        in notes[1]
    )
    assert fresh.step == 3 and fresh.optimizer_steps == 1 and not fresh.at_window_boundary
    assert fresh.is_sync_step()  # windows stay aligned to multiples of K: step 4 closes this one


def test_state_resumed_with_another_accumulation_says_the_first_window_is_short():
    loop, _, _ = run(4, 2, 6)  # boundary under K=2
    fresh = TrainLoop(
        wrapped(TinyRegressor()), torch.optim.SGD(TinyRegressor().parameters(), lr=0.1), accelerator=acc(4)
    )
    notes = fresh.load_state_dict(loop.state_dict())
    assert notes == [
        (
            "the first update after the resume (at step 8) uses the 2 micro-batch(es) of steps 7-8, not 4: "
            "step 6 is not a multiple of the 4 accumulation steps"
        )
    ]
    assert fresh.optimizer_steps == 3 and not fresh.is_sync_step() and fresh.is_sync_step(8)


def test_invalid_clip_norm():
    m = TinyRegressor()
    with pytest.raises(ValueError, match="grad_clip_norm"):
        TrainLoop(wrapped(m), torch.optim.SGD(m.parameters(), lr=0.1), grad_clip_norm=0.0)
    with pytest.raises(TypeError, match="what lerobot_parallel.wrap_model returns"):
        TrainLoop(m, torch.optim.SGD(m.parameters(), lr=0.1))
