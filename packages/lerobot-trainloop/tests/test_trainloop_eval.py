"""The held-out eval loss in one process: the sharding gives every rank the same number of batches
and covers the set exactly once, the value is the sample-weighted mean (so it does not depend on
the batch size or the number of ranks), training is not disturbed (eval mode inside, RNG forked,
live weights restored), and an EMA's weights are what it evaluates when asked. Across ranks:
tests/test_ema_layouts.py (one process, DDP x2 and FSDP2 x2 log the same eval loss)."""

from __future__ import annotations

import pytest
import torch
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop import EmaConfig, ModelEma, ShardedBatchSampler, TrainLoop
from lerobot_trainloop.evaluation import EvalBatches, evaluate
from lerobot_trainloop.testing import SyntheticRegression, TinyRegressor
from torch import nn

RT = ParallelRuntime.single("cpu")


@pytest.mark.parametrize(("n", "batch", "world"), [(10, 3, 1), (10, 3, 2), (7, 2, 3), (2, 4, 4), (64, 8, 2)])
def test_sharding_is_even_in_batches_and_exact_in_samples(n, batch, world):
    indices = list(range(100, 100 + n))
    shards = [EvalBatches(indices, batch, dp_rank=r, dp_world_size=world) for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # the same number of forwards on every rank
    real = []
    for s in shards:
        batches, weights = list(s), s.weights()
        assert len(batches) == len(weights) == len(s)
        for b, w in zip(batches, weights, strict=True):
            assert b  # never an empty batch (a placeholder instead)
            real += b[:w]
            if w == 0:
                assert b == [100]  # the set's first sample, weighted 0
    assert sorted(real) == indices  # every held-out sample exactly once


def model_and_loop(model: nn.Module) -> TrainLoop:
    return TrainLoop(
        wrap_model(model, RT, build_plan(model, RT)), torch.optim.SGD(model.parameters(), lr=0.1)
    )


def reference_loss(model, ds, indices):
    """The held-out set's per-sample mean MSE, computed directly."""
    with torch.no_grad():
        b = ds.batch(indices)
        per_sample = ((model.net(b["x"]) - b["y"]) ** 2).mean(dim=1)
    return per_sample.mean().item()


@pytest.mark.parametrize(("batch", "world"), [(5, 1), (8, 1), (3, 2), (4, 3)])
def test_value_is_the_sample_weighted_mean_whatever_the_split(batch, world):
    ds = SyntheticRegression(23, seed=3)
    model = TinyRegressor(seed=1)
    loop = model_and_loop(model)
    indices = list(range(2, 23))
    # ranks simulated one after the other: their weighted sums add up as the all-reduce adds them
    total = 0.0
    for r in range(world):
        sampler = EvalBatches(indices, batch, dp_rank=r, dp_world_size=world)
        out = evaluate(loop, (ds.batch(b) for b in sampler), sampler.weights())
        total += out["loss"] * sum(sampler.weights())
    assert abs(total / len(indices) - reference_loss(model, ds, indices)) < 1e-6
    assert set(out) == {"loss", "mse", "l1"}


class Dropout(TinyRegressor):
    def __init__(self):
        super().__init__(seed=4)
        self.drop = nn.Dropout(0.5)

    def forward(self, batch):
        pred = self.net(self.drop(batch["x"]))
        loss = ((pred - batch["y"]) ** 2).mean()
        return loss, {}


def train(with_eval: bool):
    torch.manual_seed(0)
    ds = SyntheticRegression(32, seed=1)
    model = Dropout()
    sampler = ShardedBatchSampler(len(ds), 4, seed=0)
    ema = ModelEma(model, EmaConfig(enable=True, decay=0.5))
    loop = TrainLoop(
        wrap_model(model, RT, build_plan(model, RT)),
        torch.optim.SGD(model.parameters(), lr=0.1),
        sampler=sampler,
        ema=ema,
    )
    seen = []
    if with_eval:
        held = EvalBatches(list(range(8)), 3)

        def hook(ev):
            assert model.training
            seen.append(evaluate(loop, (ds.batch(b) for b in held), held.weights(), ema=ema)["loss"])
            assert model.training  # back to training mode after it

        loop.add_hook(hook, every=2)
    loop.run((ds.batch(ix) for ix in sampler), 6)
    return model, ema, seen


def test_eval_does_not_disturb_training_and_evaluates_the_ema():
    plain, plain_ema, _ = train(False)
    evaluated, ema, seen = train(True)
    assert len(seen) == 3
    # dropout draws and every update identical to a run without evals: RNG forked, eval mode, weights restored
    assert all(
        torch.equal(a, b) for a, b in zip(plain.state_dict().values(), evaluated.state_dict().values())
    )
    assert all(torch.equal(a, b) for a, b in zip(plain_ema.state().values(), ema.state().values()))
    # the value is the EMA weights' (eval mode: no dropout)
    ds = SyntheticRegression(32, seed=1)
    with ema.swapped():
        expected = reference_loss(evaluated, ds, list(range(8)))
    assert abs(seen[-1] - expected) < 1e-6
    assert (
        abs(reference_loss(evaluated, ds, list(range(8))) - expected) > 1e-6
    )  # live weights give another value


def test_an_empty_set_is_refused():
    with pytest.raises(ValueError, match="empty"):
        EvalBatches([], 4)


class Noisy(TinyRegressor):
    """A loss with per-sample noise keyed by the sample's index and one base drawn from the global RNG per
    forward, as Diffusion Policy draws its noise and timesteps."""

    def forward(self, batch):
        base = int(torch.randint(0, 2**31 - 1, ()).item())
        noise = torch.stack(
            [torch.randn((), generator=torch.Generator().manual_seed(base + int(i))) for i in batch["index"]]
        )
        pred = self.net(batch["x"])
        per_sample = ((pred - batch["y"]) ** 2).mean(dim=1) + noise
        return per_sample.mean(), {}


def test_a_seed_makes_a_noisy_policys_eval_independent_of_batches_and_steps():
    ds = SyntheticRegression(20, seed=3)
    loop = model_and_loop(Noisy(seed=1))
    indices = list(range(20))

    def value(batch, seed):
        sampler = EvalBatches(indices, batch)
        return evaluate(loop, (ds.batch(b) for b in sampler), sampler.weights(), seed=seed)["loss"]

    seeded = [value(b, 7) for b in (3, 5, 20)]
    assert max(seeded) - min(seeded) < 1e-6 * abs(seeded[0])  # the same noise per sample, whatever its batch
    torch.manual_seed(0)
    unseeded = [value(b, None) for b in (3, 5, 20)]
    assert max(unseeded) - min(unseeded) > 1e-3  # without it, noise follows the batch and the step
