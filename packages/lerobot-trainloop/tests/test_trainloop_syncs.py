"""No host syncs on ordinary steps: the loop reads the device (loss, parts, grad norm, the non-finite
record, the metric window) only where a hook needs it, and a NaN is still caught before any hook
that could save it, naming the step where it appeared. Counted by patching every tensor read and
collective (lerobot_trainloop.testing.HostSyncCounter); the multi-process side (DDP x2: no blocking
collective but DDP's own) runs in tests/multiproc/engine_checks.py."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop import NonFiniteLossError, ShardedBatchSampler, TrainLoop
from lerobot_trainloop.loop import StepOutput
from lerobot_trainloop.testing import HostSyncCounter, SyntheticRegression, TinyRegressor

RT = ParallelRuntime.single("cpu")


class NaNAt(TinyRegressor):
    def __init__(self, *bad_calls):
        super().__init__(seed=2)
        self.calls, self.bad_calls = 0, bad_calls

    def forward(self, batch):
        loss, info = super().forward(batch)
        self.calls += 1
        return (loss * float("nan") if self.calls in self.bad_calls else loss), info


def batches(n=40):
    ds = SyntheticRegression(64, seed=1)
    sampler = ShardedBatchSampler(len(ds), 8, seed=0, max_batches=n)
    return [ds.batch(ix) for ix in sampler]


def loop_for(model=None, clip=1.0, allow=False):
    model = model or TinyRegressor(seed=2)
    return TrainLoop(
        wrap_model(model, RT, build_plan(model, RT)),
        torch.optim.SGD(model.parameters(), lr=0.05),
        grad_clip_norm=clip,
        allow_nonfinite_loss=allow,
    )


def test_no_host_sync_on_non_log_steps_and_the_counter_sees_the_log_step():
    """Steps 1-10 and 12-21 read nothing, although a check_finite=False hook runs at every step; the
    log steps (11, 22) read: so the counter works and the zeros are real."""
    loop = loop_for()
    seen: list[StepOutput] = []
    logged: list[dict] = []
    loop.add_hook(lambda e: seen.append(e.output), every=1, check_finite=False)
    loop.add_hook(lambda e: logged.append(e.metrics), every=11, metrics=True)
    data = batches()
    with HostSyncCounter(label=lambda: loop.step) as counter:
        loop.run(data, 22)
    per_step = {s: counter.syncs(s) for s in range(23)}
    assert all(per_step[s] == [] for s in range(11)), per_step  # label = steps completed when it happened
    assert all(per_step[s] == [] for s in range(12, 22)), per_step
    assert per_step[11] and per_step[22], per_step
    assert len(per_step[11]) == 1  # the whole window (metrics + non-finite record) in one read
    assert isinstance(seen[0].loss, torch.Tensor) and isinstance(seen[0].grad_norm, torch.Tensor)
    assert isinstance(seen[0].info["mse"], torch.Tensor)
    assert logged[0]["loss"] == pytest.approx(sum(float(o.loss) for o in seen[:11]) / 11)
    assert logged[0]["grad_norm"] == pytest.approx(sum(float(o.grad_norm) for o in seen[:11]) / 11)
    assert logged[0]["peak_rss_gb"] > 0


def test_a_checking_hook_step_reads_once_and_the_end_of_run_reads():
    loop = loop_for()
    loop.add_hook(lambda e: None, at=[5])  # a "save": check_finite by default
    data = batches()
    with HostSyncCounter(label=lambda: loop.step) as counter:
        loop.run(data, 8)
    assert {s: len(counter.syncs(s)) for s in range(9) if counter.syncs(s)} == {5: 1, 8: 1}


def test_nan_is_caught_before_the_next_checking_hook_naming_its_step():
    saved = []
    loop = loop_for(NaNAt(3))
    loop.add_hook(lambda e: saved.append(e.step), every=1, check_finite=False)  # reads nothing
    loop.add_hook(lambda e: saved.append(("save", e.step)), at=[2, 6])
    with pytest.raises(
        NonFiniteLossError, match=r"rank 0: loss is nan at loop step 3 \(read at loop step 6"
    ) as exc:
        loop.run(batches(), 10)
    assert "allow_nonfinite_loss" in str(exc.value) and "Check the data and learning rate" in str(exc.value)
    assert loop.step == 6 and ("save", 2) in saved and ("save", 6) not in saved


def test_nan_in_a_log_window_stops_at_the_log_step():
    loop = loop_for(NaNAt(4, 7))
    loop.add_hook(lambda e: pytest.fail("logged a NaN window"), every=5, metrics=True)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at loop step 4 \(read at loop step 5"):
        loop.run(batches(), 10)


def test_nan_after_the_last_hook_stops_at_the_end_of_the_run():
    loop = loop_for(NaNAt(9))
    loop.add_hook(lambda e: None, every=4, metrics=True)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at loop step 9 \(read at loop step 10"):
        loop.run(batches(), 10)


def test_allowed_nan_warns_once_naming_the_first_step(caplog):
    loop = loop_for(NaNAt(2, 3, 6), allow=True)
    logged = []
    loop.add_hook(lambda e: logged.append(e.metrics["loss"]), every=4, metrics=True)
    with caplog.at_level(logging.WARNING, logger="lerobot_trainloop.loop"):
        loop.run(batches(), 8)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "loss is nan at loop step 2 (read at loop step 4" in warnings[0], warnings
    assert loop.step == 8 and all(math.isnan(v) for v in logged)  # the windows' means are NaN, and say so
