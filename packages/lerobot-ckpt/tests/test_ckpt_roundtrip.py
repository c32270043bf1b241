"""Single-process save → load: each file's content, and bitwise-equal state after the round trip."""

import json
import math
import os
import random

import numpy as np
import pytest
import torch
from lerobot_ckpt import (
    CheckpointPaths,
    Parallelism,
    RunInfo,
    TrainingObjects,
    load_checkpoint,
    read_training_step,
    save_checkpoint,
)
from safetensors import safe_open
from safetensors.torch import load_file, load_model
from torch import nn


class Tied(nn.Module):
    """Embedding tied to the output head, plus a buffer: the shapes of a real policy's state dict."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 4))
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, idx):
        self.calls += 1
        return self.head(self.body(self.emb(idx)))


def _train(model, optimizer, scheduler=None, steps=3, scaler=None):
    for _ in range(steps):
        loss = model(torch.randint(0, 6, (5,))).pow(2).mean()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()


def _raw(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _assert_same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(_raw(a), _raw(b)), where  # bitwise: NaN payloads and -0.0 count
    elif isinstance(a, dict):
        assert type(a) is type(b) and a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def _fresh(seed=123):
    torch.manual_seed(seed)
    model = Tied()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 5], gamma=0.5)
    return model, opt, sched


def test_files_and_their_content(tmp_path):
    model, opt, sched = _fresh(0)
    _train(model, opt, sched)

    def pretrained(path):
        (path / "config.json").write_text('{"type": "tied"}')
        (path / "train_config.json").write_text('{"steps": 3}')

    run = RunInfo(world_size=1, batch_size=5, grad_accum_steps=2, versions={"lerobot-cli": "9.9"})
    step_dir = save_checkpoint(
        tmp_path,
        3,
        run=run,
        objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
        sampler_state={"epoch": 1, "offset": 15},
        write_pretrained=pretrained,
    )
    assert torch.equal(
        load_file(step_dir / "training_state" / "rng_state.safetensors")["torch_rng_state"],
        torch.get_rng_state(),
    )  # captured at save time, nothing drawn since
    assert step_dir == tmp_path / "checkpoints" / "000003"
    assert os.readlink(tmp_path / "checkpoints" / "last") == "000003"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["000003", "last"]
    p = CheckpointPaths(step_dir)
    assert sorted(os.listdir(p.pretrained_model)) == ["config.json", "model.safetensors", "train_config.json"]
    assert sorted(os.listdir(p.training_state)) == [
        "optimizer_param_groups.json",
        "optimizer_state.safetensors",
        "rng_state.safetensors",
        "scheduler_state.json",
        "training_step.json",
    ]  # no scaler_state.json: not an fp16 run

    # model.safetensors: tied head stored once, aliased in the header; LeRobot's loader reads it
    with safe_open(p.model_weights, "pt") as f:
        assert set(f.keys()) == set(model.state_dict()) - {"head.weight"}
        assert f.metadata() == {"format": "pt", "head.weight": "emb.weight"}
    reloaded = Tied()
    load_model(reloaded, p.model_weights)
    _assert_same(model.state_dict(), reloaded.state_dict())

    # optimizer: LeRobot's key layout, JSON param groups with the param index lists
    flat = load_file(p.optimizer_state)
    assert set(flat) == {f"state/{i}/{n}" for i in range(7) for n in ("step", "exp_avg", "exp_avg_sq")}
    groups = json.loads(p.optimizer_param_groups.read_text())
    assert groups[0]["params"] == list(range(7)) and groups[0]["betas"] == [0.8, 0.95]
    assert groups[0]["lr"] == opt.param_groups[0]["lr"]

    assert json.loads(p.scheduler_state.read_text())["milestones"] == {"2": 1, "5": 1}
    rng = load_file(p.rng_state)
    assert {
        "py_rng_version",
        "py_rng_state",
        "np_rng_state_values",
        "np_rng_cached_gaussian",
        "torch_rng_state",
    } <= set(rng)

    record = json.loads(p.training_step.read_text())
    assert {
        k: record[k]
        for k in (
            "format_version",
            "step",
            "world_size",
            "dp_world_size",
            "batch_size",
            "grad_accum_steps",
            "mixed_precision",
            "parallelism",
            "checkpoint_format",
            "sampler",
        )
    } == {
        "format_version": 1,
        "step": 3,
        "world_size": 1,
        "dp_world_size": 1,
        "batch_size": 5,
        "grad_accum_steps": 2,
        "mixed_precision": "no",
        "parallelism": {"dp_replicate": 1, "dp_shard": 1},
        "checkpoint_format": "safetensors",
        "sampler": {"epoch": 1, "offset": 15},
    }
    assert record["artifacts"] == {
        "model_safetensors": True,
        "model_dcp": False,
        "optimizer_single_file": True,
        "optimizer_dcp": False,
        "peft_adapter": False,
        "ema_safetensors": False,
        "ema_dcp": False,
        "scheduler": True,
        "scaler": False,
    }
    assert record["versions"]["lerobot-ckpt"] == "0.1.0" and record["versions"]["lerobot-cli"] == "9.9"
    assert record["versions"]["torch"] == torch.__version__
    parsed = read_training_step(step_dir / "pretrained_model" / "train_config.json")
    assert parsed.effective_batch_size == 10 and parsed.sampler == {"epoch": 1, "offset": 15}
    assert parsed.changes_for(RunInfo(world_size=2, batch_size=5, grad_accum_steps=2)) == [
        "world_size: 1 → 2",
        "dp_replicate: 1 → 2",
    ]


def test_bitwise_round_trip_of_model_optimizer_scheduler_and_rng(tmp_path):
    model, opt, sched = _fresh(0)
    _train(model, opt, sched, steps=4)
    random.seed(5)
    np.random.seed(6)
    random.gauss(0, 1)  # leaves a cached Gaussian in Python's generator
    np.random.standard_normal()  # ... and in NumPy's
    save_checkpoint(
        tmp_path,
        4,
        run=RunInfo(world_size=1, batch_size=5),
        objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
    )
    after_save = (
        random.random(),
        random.gauss(0, 1),
        np.random.standard_normal(),
        np.random.rand(3).tolist(),
        torch.rand(4).tolist(),
        torch.randn(2).tolist(),
    )
    saved = (model.state_dict(), opt.state_dict(), sched.state_dict())

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    model2, opt2, sched2 = _fresh(7)
    state = load_checkpoint(
        tmp_path / "checkpoints" / "last",
        objects=TrainingObjects(model=model2, optimizer=opt2, scheduler=sched2),
    )
    after_load = (
        random.random(),
        random.gauss(0, 1),
        np.random.standard_normal(),
        np.random.rand(3).tolist(),
        torch.rand(4).tolist(),
        torch.randn(2).tolist(),
    )
    assert after_load == after_save
    assert state.step == 4 and state.rng_restored and not state.scaler_restored
    _assert_same(saved[0], model2.state_dict(), "model")
    _assert_same(saved[1], opt2.state_dict(), "optimizer")
    _assert_same(saved[2], sched2.state_dict(), "scheduler")
    assert model2.head.weight is model2.emb.weight  # ties survive

    # training continues identically from both
    torch.manual_seed(1)
    _train(model, opt, sched, steps=2)
    torch.manual_seed(1)
    _train(model2, opt2, sched2, steps=2)
    _assert_same(model.state_dict(), model2.state_dict(), "model after two more steps")


def test_fp16_scaler_round_trip_and_awkward_optimizer_states(tmp_path):
    torch.manual_seed(0)
    model = Tied()
    # SGD's momentum buffers are None until the first step: a non-tensor state entry
    sgd = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.05), momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(sgd)  # holds best=inf
    _train(model, sgd, steps=3, scaler=scaler)
    sgd.state[next(iter(model.parameters()))]["note"] = None
    run = RunInfo(world_size=1, batch_size=5, mixed_precision="fp16")
    objects = TrainingObjects(model=model, optimizer=sgd, scheduler=plateau, scaler=scaler)
    step_dir = save_checkpoint(tmp_path, 3, run=run, objects=objects)
    assert (
        json.loads((step_dir / "training_state" / "scaler_state.json").read_text())["scale"]
        == scaler.get_scale()
    )

    torch.manual_seed(1)
    model2 = Tied()
    sgd2 = torch.optim.SGD(model2.parameters(), lr=torch.tensor(0.5), momentum=0.9)
    scaler2 = torch.amp.GradScaler("cpu")
    plateau2 = torch.optim.lr_scheduler.ReduceLROnPlateau(sgd2, patience=3)
    objects = TrainingObjects(model=model2, optimizer=sgd2, scheduler=plateau2, scaler=scaler2)
    state = load_checkpoint(step_dir, objects=objects)
    assert state.scaler_restored and state.record.mixed_precision == "fp16"
    _assert_same(sgd.state_dict(), sgd2.state_dict(), "sgd")
    _assert_same(scaler.state_dict(), scaler2.state_dict(), "scaler")
    _assert_same(plateau.state_dict(), plateau2.state_dict(), "plateau")


def test_lbfgs_integer_state_round_trips(tmp_path):
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3))
    opt = torch.optim.LBFGS([w], max_iter=3)
    opt.step(lambda: (opt.zero_grad(), (w.pow(2).sum()).backward(), w.pow(2).sum())[-1])
    assert isinstance(opt.state_dict()["state"][0]["n_iter"], int)
    save_checkpoint(
        tmp_path,
        1,
        run=RunInfo(world_size=1, batch_size=1),
        objects=TrainingObjects(model={"w": w.detach()}, optimizer=opt),
    )
    w2 = nn.Parameter(torch.zeros(3))
    opt2 = torch.optim.LBFGS([w2], max_iter=3)
    load_checkpoint(tmp_path, objects=TrainingObjects(optimizer=opt2), restore_rng=False)
    _assert_same(opt.state_dict(), opt2.state_dict(), "lbfgs")


def test_ddp_and_compile_wrappers_are_unwrapped_and_sampler_state_kept(tmp_path):
    model, opt, _ = _fresh(0)

    class Wrapper(nn.Module):  # the shape of torch.compile's OptimizedModule
        def __init__(self, inner):
            super().__init__()
            self._orig_mod = inner

    save_checkpoint(
        tmp_path,
        2,
        run=RunInfo(world_size=1, batch_size=5),
        objects=TrainingObjects(model=Wrapper(model), optimizer=opt),
        sampler_state={"epoch": 3, "offset": 10, "seed": 1000},
    )
    with safe_open(tmp_path / "checkpoints" / "000002" / "pretrained_model" / "model.safetensors", "pt") as f:
        assert not any(k.startswith("_orig_mod") for k in f.keys())  # noqa: SIM118 - safe_open is not a dict
    model2, opt2, _ = _fresh(3)
    state = load_checkpoint(tmp_path, objects=TrainingObjects(model=Wrapper(model2), optimizer=opt2))
    assert state.sampler_state == {"epoch": 3, "offset": 10, "seed": 1000}
    _assert_same(model.state_dict(), model2.state_dict())


def test_resaving_a_step_replaces_it_and_last_stays_valid(tmp_path):
    model, opt, _ = _fresh(0)
    run = RunInfo(world_size=1, batch_size=5)
    save_checkpoint(
        tmp_path, 1, run=run, objects=TrainingObjects(model=model, optimizer=opt), sampler_state={"v": 1}
    )
    save_checkpoint(
        tmp_path, 2, run=run, objects=TrainingObjects(model=model, optimizer=opt), sampler_state={"v": 2}
    )
    # a run resumed from step 1 saves step 2 again: the old step 2 (which `last` points to) is replaced
    save_checkpoint(
        tmp_path, 2, run=run, objects=TrainingObjects(model=model, optimizer=opt), sampler_state={"v": 3}
    )
    ckpts = tmp_path / "checkpoints"
    assert sorted(os.listdir(ckpts)) == ["000001", "000002", "last"]  # nothing superseded is left behind
    assert read_training_step(ckpts / "last").sampler == {"v": 3}
    assert read_training_step(ckpts / "000001").sampler == {"v": 1}


def test_foreign_trainer_may_pass_a_state_dict_and_custom_parallelism(tmp_path):
    run = RunInfo(world_size=4, batch_size=2, parallelism=Parallelism(dp_replicate=4, dp_shard=1))
    # (world_size 4 on one process is refused only when torch.distributed says otherwise: not here)
    state = {"a": torch.arange(6.0).reshape(2, 3).t(), "b": torch.ones(2, dtype=torch.bfloat16)}
    step_dir = save_checkpoint(tmp_path, 10, run=run, objects=TrainingObjects(model=state))
    loaded = load_file(step_dir / "pretrained_model" / "model.safetensors")
    _assert_same({k: v.contiguous() for k, v in state.items()}, loaded)
    assert read_training_step(step_dir).dp_world_size == 4


@pytest.mark.parametrize("step", [0, 1_234_567])
def test_step_zero_and_wide_steps(tmp_path, step):
    d = save_checkpoint(
        tmp_path,
        step,
        run=RunInfo(world_size=1, batch_size=1),
        objects=TrainingObjects(model={"x": torch.ones(1)}),
    )
    assert d.name == f"{step:06d}" and read_training_step(tmp_path).step == step


def test_peft_adapter_written_by_the_hook_and_applied_on_resume(tmp_path):
    from lerobot_ckpt import CheckpointConfigError
    from safetensors.torch import save_file

    lora = {
        "base_model.model.head.lora_A.weight": torch.randn(2, 4),
        "base_model.model.head.lora_B.weight": torch.zeros(6, 2),
    }

    def peft_save_pretrained(path):  # what PeftModel.save_pretrained writes
        save_file(lora, path / "adapter_model.safetensors", metadata={"format": "pt"})
        (path / "adapter_config.json").write_text(
            json.dumps({"peft_type": "LORA", "r": 2, "base_model_name_or_path": "user/base"})
        )

    _, opt, _ = _fresh(0)
    step_dir = save_checkpoint(
        tmp_path,
        7,
        run=RunInfo(world_size=1, batch_size=1),
        objects=TrainingObjects(optimizer=opt),
        write_pretrained=peft_save_pretrained,
    )
    assert sorted(os.listdir(step_dir / "pretrained_model")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    artifacts = read_training_step(step_dir).artifacts
    assert artifacts.peft_adapter and not artifacts.model_safetensors
    with pytest.raises(CheckpointConfigError, match="holds a PEFT adapter, not full weights"):
        load_checkpoint(step_dir, objects=TrainingObjects(model=Tied()))
    received = {}
    load_checkpoint(
        step_dir, objects=TrainingObjects(model=Tied(), optimizer=_fresh(1)[1]), apply_adapter=received.update
    )
    _assert_same(lora, received, "adapter")
