"""Values read on resume are checked before anything changes: weights of the wrong kind (integers where
the model holds floats) or holding NaN, impossible optimizer moments, RNG states the generators would
refuse (or silently alter), and scheduler counters of the wrong type. Each is one line naming the
file and the entry, and the model, optimizer and every random generator are left as they were."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_ckpt import (
    CheckpointError,
    CheckpointPaths,
    ModelMismatchError,
    RunInfo,
    TrainingObjects,
    load_checkpoint,
    read_tensors,
    save_checkpoint,
    write_tensors,
)
from lerobot_ckpt.state import rng
from torch import nn

RUN = RunInfo(world_size=1, batch_size=4)


def _objects(seed: int = 0) -> TrainingObjects:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    ema = {name: p.detach().clone() for name, p in model.named_parameters()}
    return TrainingObjects(model=model, optimizer=opt, scheduler=sched, ema=ema)


@pytest.fixture
def step(tmp_path) -> Path:
    objects = _objects()
    model, opt, sched = objects.model, objects.optimizer, objects.scheduler
    for _ in range(2):
        model(torch.randn(4, 5)).pow(2).mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return save_checkpoint(tmp_path, 2, run=RUN, objects=objects)


def _edit_tensors(path: Path, edit) -> None:
    tensors, _ = read_tensors(path)
    tensors = dict(tensors)
    edit(tensors)
    path.unlink()
    write_tensors(path, tensors)


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _generators() -> tuple:
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


def _refused(step: Path, match: str, error=CheckpointError) -> None:
    objects = _objects(seed=1)
    before = {k: v.clone() for k, v in objects.model.state_dict().items()}
    ema_before = {k: v.clone() for k, v in objects.ema.items()}
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    generators = _generators()
    with pytest.raises(error, match=match) as caught:
        load_checkpoint(step, objects=objects)
    assert "\n" not in str(caught.value)
    assert all(torch.equal(before[k], v) for k, v in objects.model.state_dict().items())
    assert all(torch.equal(ema_before[k], v) for k, v in objects.ema.items())
    assert objects.optimizer.state_dict()["state"] == {}
    assert _generators() == generators  # no generator changed, not even a later one


def test_the_untouched_checkpoint_loads(step):
    objects = _objects(seed=1)
    load_checkpoint(step, objects=objects)
    assert objects.scheduler.last_epoch == 2


@pytest.mark.parametrize("where", ["model", "ema"])
def test_integer_weights_are_refused(step, where):
    paths = CheckpointPaths(step)
    file = paths.model_weights if where == "model" else paths.ema.model_weights

    def to_int(t):
        t["2.bias"] = t["2.bias"].to(torch.int64)

    _edit_tensors(file, to_int)
    _refused(step, rf"{file}.*2\.bias.*int64", ModelMismatchError)


@pytest.mark.parametrize("where", ["model", "ema"])
def test_nan_weights_are_refused(step, where):
    paths = CheckpointPaths(step)
    file = paths.model_weights if where == "model" else paths.ema.model_weights

    def all_nan(t):
        for k in t:
            t[k] = torch.full_like(t[k], float("nan"))

    _edit_tensors(file, all_nan)
    _refused(step, rf"{file}.*tensor \S+ holds NaN")


def test_float_weights_of_another_width_still_load(step, caplog):
    paths = CheckpointPaths(step)
    _edit_tensors(paths.model_weights, lambda t: t.update({"2.bias": t["2.bias"].to(torch.float64)}))
    objects = _objects(seed=1)
    load_checkpoint(step, objects=objects)
    assert objects.model.state_dict()["2.bias"].dtype == torch.float32
    assert "another float type" in caplog.text


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("exp_avg_sq", -1.0, "state/0/exp_avg_sq holds negative values"),
        ("exp_avg", float("nan"), "state/0/exp_avg holds NaN"),
        ("exp_avg_sq", float("inf"), "state/0/exp_avg_sq holds NaN or infinite"),
    ],
)
def test_impossible_optimizer_state_is_refused(step, name, value, match):
    file = CheckpointPaths(step).optimizer_state
    _edit_tensors(file, lambda t: t.update({f"state/0/{name}": torch.full_like(t[f"state/0/{name}"], value)}))
    _refused(step, rf"{file}.*{match}")


def _set(key, value):
    return lambda t: t.update({key: value})


def _drop(key):
    return lambda t: t.pop(key)


RNG_EDITS = {
    "py_rng_state shortened": (lambda t: t.update(py_rng_state=t["py_rng_state"][:100]), "py_rng_state"),
    "py_rng_version 7": (_set("py_rng_version", torch.tensor([7])), "py_rng_version"),
    "py_rng_state 2**40": (
        lambda t: t.update(py_rng_state=torch.full_like(t["py_rng_state"], 2**40)),
        "py_rng_state",
    ),
    "np index 10**12": (_set("np_rng_state_index", torch.tensor([10**12])), "np_rng_state_index"),
    "torch state 3 bytes": (_set("torch_rng_state", torch.zeros(3, dtype=torch.uint8)), "torch_rng_state"),
    "py_rng_version shape (2,)": (_set("py_rng_version", torch.tensor([3, 3])), "py_rng_version"),
    "np_rng_has_gauss empty": (
        _set("np_rng_has_gauss", torch.zeros(0, dtype=torch.int64)),
        "np_rng_has_gauss",
    ),
    "py gauss missing": (
        lambda t: (t.update(py_rng_has_gauss=torch.tensor([1])), t.pop("py_rng_gauss_next")),
        "py_rng_gauss_next",
    ),
    "np values float32": (
        lambda t: t.update(np_rng_state_values=t["np_rng_state_values"].to(torch.float32)),
        "np_rng_state_values",
    ),
    "np values 2**33": (
        lambda t: t.update(np_rng_state_values=torch.full_like(t["np_rng_state_values"], 2**33)),
        "np_rng_state_values",
    ),
    "np cached gaussian nan": (
        _set("np_rng_cached_gaussian", torch.tensor([float("nan")], dtype=torch.float64)),
        "np_rng_cached_gaussian",
    ),
}


@pytest.mark.parametrize("case", sorted(RNG_EDITS))
def test_rng_states_the_generators_would_refuse_are_one_line(step, case):
    edit, entry = RNG_EDITS[case]
    file = CheckpointPaths(step).rng_state
    _edit_tensors(file, edit)
    _refused(step, rf"rng_state\.safetensors.*{entry}")


def test_rng_restore_roundtrip_unchanged(step):
    state = rng.capture()
    assert rng.check(Path("x"), state) is state


def test_lerobot_written_uint32_numpy_keys_still_restore(step):
    """LeRobot stores NumPy's key as torch.uint32 (``torch.tensor`` of the uint32 array)."""
    file = CheckpointPaths(step).rng_state
    saved = read_tensors(file)[0]["np_rng_state_values"]
    _edit_tensors(file, lambda t: t.update(np_rng_state_values=t["np_rng_state_values"].to(torch.uint32)))
    load_checkpoint(step, objects=_objects(seed=1))
    assert np.random.get_state()[1].tolist() == saved.tolist()


SCHEDULER_EDITS = {
    "last_epoch string": ({"last_epoch": "abc"}, "last_epoch"),
    "last_epoch -50": ({"last_epoch": -50}, "last_epoch"),
    "last_epoch bool": ({"last_epoch": True}, "last_epoch"),
    "base_lrs too few": ({"base_lrs": []}, "base_lrs"),
    "base_lrs string": ({"base_lrs": ["x"]}, r"base_lrs\[0\]"),
    "base_lrs nan": ({"base_lrs": [float("nan")]}, r"base_lrs\[0\]"),
    "base_lrs negative": ({"base_lrs": [-1.0]}, r"base_lrs\[0\]"),
}


@pytest.mark.parametrize("case", sorted(SCHEDULER_EDITS))
def test_scheduler_counters_of_the_wrong_kind_are_one_line(step, case):
    values, entry = SCHEDULER_EDITS[case]
    file = CheckpointPaths(step).scheduler_state
    _edit_json(file, lambda d: d.update(values))
    _refused(step, rf"scheduler_state\.json.*{entry}")
