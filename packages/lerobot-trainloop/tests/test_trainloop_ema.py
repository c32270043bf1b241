"""The EMA shadow in one process: diffusers' decay schedule, the update arithmetic, what it covers
(trainable parameters, tied ones once), the eval swap, and its place in the loop (one update per
optimizer update, none inside an accumulation window, no host sync). Sharded shadows:
tests/test_ema_layouts.py."""

from __future__ import annotations

import pytest
import torch
from lerobot_parallel import AcceleratorConfig, GradientAccumulationConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop import EmaConfig, ModelEma, ShardedBatchSampler, TrainLoop
from lerobot_trainloop.testing import HostSyncCounter, SyntheticRegression, TinyRegressor
from torch import nn

RT = ParallelRuntime.single("cpu")


def reference_decay(n, update_after_step=0, inv_gamma=1.0, power=0.75, min_decay=0.0, max_decay=0.9999):
    """diffusers.training_utils.EMAModel.get_decay with use_ema_warmup=True, written out."""
    step = max(0, n - update_after_step - 1)
    if step <= 0:
        return 0.0
    return max(min(1 - (1 + step / inv_gamma) ** -power, max_decay), min_decay)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"update_after_step": 3}, {"inv_gamma": 2.0, "power": 2 / 3}, {"min_decay": 0.5, "max_decay": 0.9}],
)
def test_decay_follows_the_warmup_schedule(kwargs):
    cfg = EmaConfig(enable=True, **kwargs)
    assert [cfg.decay_at(n) for n in range(1, 40)] == [reference_decay(n, **kwargs) for n in range(1, 40)]


def test_constant_decay_after_the_first_copy():
    cfg = EmaConfig(enable=True, decay=0.99, update_after_step=2)
    assert [cfg.decay_at(n) for n in range(1, 6)] == [0.0, 0.0, 0.0, 0.99, 0.99]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"decay": 1.5}, "ema.decay must be a number in [0, 1]"),
        ({"update_after_step": -1}, "ema.update_after_step must be an integer ≥ 0"),
        ({"inv_gamma": 0}, "ema.inv_gamma must be a number > 0"),
        ({"power": -1.0}, "ema.power must be a number > 0"),
        ({"min_decay": 0.9, "max_decay": 0.5}, "ema.min_decay must be ≤ ema.max_decay"),
        (
            {"decay": 0.99, "max_decay": 0.9},
            "ema.decay \\(a constant decay\\) excludes changed ema.min_decay",
        ),
        ({"enable": "yes"}, "ema.enable must be true or false"),
    ],
)
def test_invalid_settings_are_refused_by_name(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        EmaConfig(**kwargs)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Linear(3, 3, bias=False)
        self.head = nn.Linear(3, 3, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.frozen = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)
        self.norm = nn.BatchNorm1d(3)


def test_shadow_covers_trainable_parameters_once_with_every_name():
    model = Tied()
    ema = ModelEma(model, EmaConfig(enable=True))
    state = ema.state()
    assert set(state) == {"emb.weight", "head.weight", "norm.weight", "norm.bias"}
    assert state["emb.weight"] is state["head.weight"]  # one shadow tensor for the tied pair
    assert ema.num_params == 9 + 3 + 3
    assert state["emb.weight"].data_ptr() != model.emb.weight.data_ptr()  # a copy, not the live tensor


def test_update_is_diffusers_arithmetic_and_reads_nothing():
    model = TinyRegressor(seed=2)
    cfg = EmaConfig(enable=True, min_decay=0.3)
    ema = ModelEma(model, cfg)
    expected = {k: v.clone() for k, v in ema.state().items()}
    for n in range(1, 6):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        with HostSyncCounter() as syncs:
            ema.update()
        assert syncs.syncs(any_label=True) == []
        d = cfg.decay_at(n)
        for name, p in model.named_parameters():  # s -= (1 - d) * (s - p), as EMAModel.step (foreach=False)
            expected[name].sub_((1 - d) * (expected[name] - p.detach()))
        assert ema.decay == d
    assert all(torch.equal(ema.state()[k], v) for k, v in expected.items())
    assert ema.updates == 5


def test_swap_computes_with_the_shadow_and_restores_the_live_weights_bitwise():
    model = TinyRegressor(seed=2)
    ema = ModelEma(model, EmaConfig(enable=True, decay=0.5))
    live = {k: v.detach().clone() for k, v in model.named_parameters()}
    ema.update()  # decay 0: a copy of the start weights
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    ema.update()  # decay 0.5: the shadow is between the start and the live weights
    moved = {k: v.detach().clone() for k, v in model.named_parameters()}
    with ema.swapped():
        assert all(torch.equal(p, ema.state()[k]) for k, p in model.named_parameters())
        assert not torch.equal(next(model.parameters()), next(iter(moved.values())))
    assert all(torch.equal(p, moved[k]) for k, p in model.named_parameters())
    assert not all(torch.equal(moved[k], live[k]) for k in live)


def test_a_model_without_trainable_parameters_is_refused():
    model = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameter"):
        ModelEma(model, EmaConfig(enable=True))


def test_loop_updates_once_per_optimizer_update_and_saves_the_counter():
    ds = SyntheticRegression(64, seed=1)
    sampler = ShardedBatchSampler(len(ds), 4, seed=0)
    model = TinyRegressor(seed=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ema = ModelEma(model, EmaConfig(enable=True, decay=0.9))
    acc = AcceleratorConfig(gradient_accumulation=GradientAccumulationConfig(2))
    loop = TrainLoop(
        wrap_model(model, RT, build_plan(model, RT)), opt, accelerator=acc, sampler=sampler, ema=ema
    )
    seen = []
    loop.add_hook(lambda e: seen.append(ema.updates), every=1, check_finite=False)
    loop.run((ds.batch(ix) for ix in sampler), 6)
    assert seen == [0, 1, 1, 2, 2, 3]  # only the window's last micro-batch updates
    assert loop.state_dict()["ema_updates"] == 3
    fresh = ModelEma(TinyRegressor(seed=2), EmaConfig(enable=True, decay=0.9))
    other = TrainLoop(
        wrap_model(TinyRegressor(seed=2), RT, build_plan(model, RT)), opt, accelerator=acc, ema=fresh
    )
    other.load_state_dict(loop.state_dict())
    assert fresh.updates == 3 and fresh.decay == 0.9


def test_an_update_the_fp16_scaler_skipped_is_not_an_ema_update():
    """The guide: the EMA steps "after every optimizer update". An update the loss scaler skipped (inf
    gradients at a huge initial scale) left the weights as they were: no EMA step, no count in the
    schedule."""
    from lerobot_parallel.precision import build_precision

    ds = SyntheticRegression(64, seed=1)
    sampler = ShardedBatchSampler(len(ds), 8, seed=0)
    model = TinyRegressor(seed=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ema = ModelEma(model, EmaConfig(enable=True, decay=0.5))
    precision = build_precision("fp16", "cpu", init_scale=2.0**40, backoff_factor=2.0**-32)
    loop = TrainLoop(
        wrap_model(model, RT, build_plan(model, RT)),
        opt,
        accelerator=AcceleratorConfig(mixed_precision="fp16"),
        precision=precision,
        sampler=sampler,
        ema=ema,
    )
    seen = []
    loop.add_hook(
        lambda e: seen.append(
            (e.output.skipped, ema.updates, {k: v.clone() for k, v in ema.state().items()})
        ),
        every=1,
        check_finite=False,
    )
    start = {k: v.clone() for k, v in ema.state().items()}
    loop.run((ds.batch(ix) for ix in sampler), 3)
    assert [(skipped, updates) for skipped, updates, _ in seen] == [(True, 0), (False, 1), (False, 2)]
    assert all(torch.equal(seen[0][2][k], v) for k, v in start.items())  # the skipped update left the shadow
    assert loop.state_dict()["ema_updates"] == 2 and loop.optimizer_steps == 2


def test_reset_restarts_from_the_live_weights():
    model = TinyRegressor(seed=2)
    ema = ModelEma(model, EmaConfig(enable=True, decay=0.5))
    ema.update()
    ema.update()
    with torch.no_grad():  # a resume loads other weights into the model after the shadow was built
        for p in model.parameters():
            p.add_(1.0)
    ema.reset()
    assert ema.updates == 0 and ema.decay is None
    assert all(torch.equal(ema.state()[k], p) for k, p in model.named_parameters())
