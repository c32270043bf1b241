"""Every refusal: clear message naming the file or key, one CheckpointError subclass, nothing modified."""

import json
import os
import random
import shutil

import numpy as np
import pytest
import torch
from lerobot_ckpt import (
    CheckpointConfigError,
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    LegacyCheckpointError,
    MissingCheckpointFileError,
    ModelMismatchError,
    OptimizerMismatchError,
    Parallelism,
    RunInfo,
    StateMismatchError,
    TrainingObjects,
    UnsupportedCheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from torch import nn


def _model(width=4, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, 2))


def _opt(model):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    return opt


@pytest.fixture
def saved(tmp_path):
    """A complete checkpoint at step 5 (model, optimizer, scheduler) and its step directory."""
    model = _model()
    opt = _opt(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    step_dir = save_checkpoint(
        tmp_path,
        5,
        run=RunInfo(world_size=1, batch_size=2),
        objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
    )
    return step_dir


def _snapshot(model, opt):
    weights = {k: v.clone() for k, v in model.state_dict().items()} if model is not None else {}
    return (
        weights,
        repr(opt.state_dict()) if opt is not None else None,
        torch.get_rng_state(),
        random.getstate(),
        np.random.get_state()[1].copy(),
    )


def _unchanged(before, model, opt):
    after = _snapshot(model, opt)
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert before[1] == after[1]
    assert torch.equal(before[2], after[2]) and before[3] == after[3] and (before[4] == after[4]).all()


def _load_expecting(step_dir, error, match, *, restore_rng=True, **objects):
    model = objects.setdefault("model", _model(seed=9))
    opt = objects.setdefault("optimizer", torch.optim.Adam(model.parameters(), lr=1e-2) if model else None)
    before = _snapshot(model, opt)
    with pytest.raises(error, match=match) as info:
        load_checkpoint(step_dir, objects=TrainingObjects(**objects), restore_rng=restore_rng)
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, ValueError)
    _unchanged(before, model, opt)
    return str(info.value)


def test_no_training_state_says_use_policy_path(saved):
    shutil.rmtree(saved / "training_state")
    msg = _load_expecting(saved, MissingCheckpointFileError, "has no training state")
    # the library speaks config paths; lerobot-train renders them as --policy.path (cli/render.py)
    assert f" policy.path={saved / 'pretrained_model'}" in msg and "--policy.path" not in msg


@pytest.mark.parametrize(
    "name",
    [
        "training_state/optimizer_state.safetensors",
        "training_state/rng_state.safetensors",
        "training_state/optimizer_param_groups.json",
        "pretrained_model/model.safetensors",
        "training_state/training_step.json",
        "training_state/scheduler_state.json",
    ],
)
def test_missing_file_is_named(saved, name):
    (saved / name).unlink()
    sched_opt = {}
    if "scheduler" in name:
        m = _model(seed=9)
        o = torch.optim.Adam(m.parameters(), lr=1e-2)
        sched_opt = {"model": m, "optimizer": o, "scheduler": torch.optim.lr_scheduler.StepLR(o, step_size=2)}
    _load_expecting(
        saved, MissingCheckpointFileError, f"checkpoint file missing: {saved / name}", **sched_opt
    )


@pytest.mark.parametrize(
    "name",
    [
        "pretrained_model/model.safetensors",
        "training_state/optimizer_state.safetensors",
        "training_state/rng_state.safetensors",
    ],
)
def test_truncated_safetensors(saved, name):
    path = saved / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 9])
    _load_expecting(saved, CorruptCheckpointError, f"unreadable or corrupt: {path}.*not fully covered")


def test_garbage_safetensors_and_bad_json(saved):
    (saved / "pretrained_model" / "model.safetensors").write_bytes(b"\x00" * 3)
    _load_expecting(saved, CorruptCheckpointError, "model.safetensors: not a readable safetensors file")


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("training_state/training_step.json", "{not json", "training_step.json: Expecting property name"),
        ("training_state/training_step.json", "[1, 2]", "expected a JSON object"),
        ("training_state/optimizer_param_groups.json", '{"lr": 1}', "expected a list of param groups"),
    ],
)
def test_corrupt_json(saved, name, text, match):
    (saved / name).write_text(text)
    _load_expecting(saved, CorruptCheckpointError, match)


def test_record_with_wrong_fields_names_them(saved):
    path = saved / "training_state" / "training_step.json"
    record = json.loads(path.read_text())
    del record["batch_size"]
    record["world_size"] = "2"
    path.write_text(json.dumps(record))
    msg = _load_expecting(saved, CorruptCheckpointError, "training_step.json")
    assert "required field missing @ training_step.batch_size" in msg
    assert "expected int @ training_step.world_size" in msg


def test_newer_record_format(saved):
    path = saved / "training_state" / "training_step.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "format_version": 99}))
    _load_expecting(saved, UnsupportedCheckpointError, "format_version=99; this lerobot-ckpt reads up to 1")


def test_model_mismatch_names_keys_and_shapes(saved):
    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.extra = nn.Linear(1, 1)
            self.first = nn.Linear(3, 4)

    msg = _load_expecting(saved, ModelMismatchError, "does not match the model", model=_model(width=5))
    assert "0.weight (checkpoint (4, 3), model (5, 3))" in msg and "3 with another shape" in msg
    msg = _load_expecting(saved, ModelMismatchError, "does not match the model", model=Other())
    assert "4 missing from the checkpoint: extra.bias, extra.weight, first.bias, first.weight" in msg
    assert "4 not in the model: 0.bias, 0.weight, 2.bias, 2.weight" in msg


def test_many_mismatches_are_summarised(tmp_path):
    save_checkpoint(
        tmp_path,
        1,
        run=RunInfo(world_size=1, batch_size=1),
        objects=TrainingObjects(model={f"w{i:02d}": torch.zeros(1) for i in range(12)}),
    )
    msg = _load_expecting(
        tmp_path,
        ModelMismatchError,
        "12 not in the model",
        model=nn.Linear(1, 1),
        optimizer=None,
        restore_rng=False,
    )
    assert "w00, w01, w02, w03, w04 (+7 more)" in msg


def test_optimizer_that_does_not_fit(saved):
    model = _model(seed=9)
    two_groups = torch.optim.Adam([{"params": model[0].parameters()}, {"params": model[2].parameters()}])
    _load_expecting(
        saved,
        OptimizerMismatchError,
        r"checkpoint has 1 param group\(s\) of \[4\] parameters, the optimizer 2 of \[2, 2\]",
        model=model,
        optimizer=two_groups,
    )
    # same structure, different parameter shapes: caught before the optimizer is touched
    wide = _model(width=5)
    msg = _load_expecting(
        saved,
        ModelMismatchError,
        "does not match the model",
        model=wide,
        optimizer=torch.optim.Adam(wide.parameters()),
    )
    assert "0.weight" in msg
    _load_expecting(
        saved,
        OptimizerMismatchError,
        r"param 0 exp_avg \(checkpoint \(4, 3\), parameter \(5, 3\)\)",
        model=None,
        optimizer=torch.optim.Adam(wide.parameters()),
    )


def test_scheduler_of_another_kind(saved):
    model = _model(seed=9)
    opt = torch.optim.Adam(model.parameters())
    _load_expecting(
        saved,
        StateMismatchError,
        "scheduler_state.json does not match this ExponentialLR",
        model=model,
        optimizer=opt,
        scheduler=torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9),
    )


def test_saved_without_scheduler_or_optimizer(tmp_path):
    save_checkpoint(
        tmp_path, 1, run=RunInfo(world_size=1, batch_size=1), objects=TrainingObjects(model=_model())
    )
    model = _model(seed=9)
    opt = torch.optim.Adam(model.parameters())
    _load_expecting(
        tmp_path, MissingCheckpointFileError, "saved without optimizer state", model=model, optimizer=opt
    )
    _load_expecting(
        tmp_path,
        MissingCheckpointFileError,
        "saved without a scheduler",
        model=model,
        optimizer=None,
        scheduler=torch.optim.lr_scheduler.StepLR(opt, 1),
    )


def _legacy(saved, record):
    (saved / "training_state" / "training_step.json").write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"step": 5, "num_processes": 4}, "num_processes=4 instead of dp_world_size"),
        ({"step": 5}, "holds only the step"),
    ],
)
def test_lerobot_legacy_checkpoints(saved, record, why):
    _legacy(saved, record)
    msg = _load_expecting(saved, LegacyCheckpointError, "written by LeRobot ≤ 0.6.x")
    assert why in msg and "no pytorch_model_fsdp_0/ or optimizer_0/ directory" in msg
    assert "cannot be resumed as a sharded run" in msg
    # the library speaks config paths; lerobot-train renders them as --policy.path (cli/render.py)
    assert f" policy.path={saved / 'pretrained_model'}" in msg and "--policy.path" not in msg


def test_record_claiming_dcp_shards_that_are_not_there(saved):
    path = saved / "training_state" / "training_step.json"
    record = json.loads(path.read_text())
    record["artifacts"].update(model_safetensors=False, model_dcp=True)
    path.write_text(json.dumps(record))
    _load_expecting(
        saved, MissingCheckpointFileError, "pytorch_model_fsdp_0 .the DCP directory does not exist"
    )


def test_bad_resume_path(tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        load_checkpoint(tmp_path / "missing", objects=TrainingObjects(model=_model()))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"run": RunInfo(world_size=1, batch_size=1, mixed_precision="fp16")}, "fp16 needs its loss scaler"),
        (
            {"run": RunInfo(world_size=1, batch_size=1), "scaler": torch.amp.GradScaler("cpu")},
            "fp16 runs only",
        ),
        (
            {"run": RunInfo(world_size=2, batch_size=1, parallelism=Parallelism(1, 2))},
            "sharded .* needs torch.distributed",
        ),
        (
            {"run": RunInfo(world_size=1, batch_size=1), "sampler_state": {"rng": object()}},
            "JSON-serialisable",
        ),
        ({"run": RunInfo(world_size=1, batch_size=1), "model": None}, "would hold no weights"),
    ],
)
def test_save_refuses_inconsistent_requests(tmp_path, kwargs, match):
    objects = {"model": _model(), **{k: kwargs.pop(k) for k in ("model", "scaler") if k in kwargs}}
    with pytest.raises(CheckpointError, match=match):
        save_checkpoint(tmp_path, 1, objects=TrainingObjects(**objects), **kwargs)
    assert not (tmp_path / "checkpoints" / "last").exists()
    assert (
        [p.name for p in (tmp_path / "checkpoints").glob("*")] == []
        if (tmp_path / "checkpoints").exists()
        else True
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"world_size": 0, "batch_size": 1}, "world_size must be an integer ≥ 1"),
        ({"world_size": 1, "batch_size": 1, "mixed_precision": "fp8"}, "mixed_precision must be one of"),
        (
            {"world_size": 3, "batch_size": 1, "parallelism": Parallelism(2, 1)},
            "does not divide world_size=3",
        ),
        ({"world_size": 2, "batch_size": 1, "checkpoint_format": "dcp"}, "only applies to sharded runs"),
    ],
)
def test_run_info_validation(kwargs, match):
    with pytest.raises(CheckpointConfigError, match=match):
        RunInfo(**kwargs)


def test_scheduler_state_that_json_cannot_hold(tmp_path):
    class Odd:
        def state_dict(self):
            return {"fn": os.getcwd}

    with pytest.raises(CheckpointError, match=r"scheduler.fn holds a builtin_function_or_method"):
        save_checkpoint(
            tmp_path,
            1,
            run=RunInfo(world_size=1, batch_size=1),
            objects=TrainingObjects(model=_model(), scheduler=Odd()),
        )
    assert not (tmp_path / "checkpoints" / "last").exists()
    assert os.listdir(tmp_path / "checkpoints") == []  # the staging directory was removed
