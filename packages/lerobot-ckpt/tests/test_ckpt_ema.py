"""An EMA shadow in one process: ``pretrained_model_ema/`` holds the model's state with the shadow in
place of the trainable weights (tied names aliased, buffers and frozen weights the live ones), beside
the same pretrained files; a resume restores it bitwise, synchronous or asynchronous save alike; a
PEFT selection keeps the adapters only; a shadow that does not fit is refused before anything
changes. Sharded shadows (DCP, resharding): tests/test_ema_layouts.py."""

from __future__ import annotations

import json

import pytest
import torch
from lerobot_ckpt import (
    AsyncCheckpointer,
    CheckpointPaths,
    CheckpointSaveError,
    ModelMismatchError,
    RunInfo,
    TrainingObjects,
    load_checkpoint,
    read_tensors,
    save_checkpoint,
)
from torch import nn

RUN = RunInfo(world_size=1, batch_size=4)


class Net(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(7, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 7, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))


def shadow_of(model: nn.Module, shift: float) -> dict[str, torch.Tensor]:
    """What an EMA keeps: trainable parameters only, every name of a tied one, one tensor each."""
    by_id: dict[int, torch.Tensor] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            out[name] = by_id.setdefault(id(p), p.detach().clone() + shift)
    return out


def write_config(directory):
    (directory / "config.json").write_text(json.dumps({"type": "net"}))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_ema_directory_and_bitwise_resume(tmp_path, asynchronous):
    model = Net()
    ema = shadow_of(model, 0.25)
    objects = TrainingObjects(model=model, ema=ema)
    saved = {k: v.clone() for k, v in ema.items()}
    if asynchronous:
        saver = AsyncCheckpointer.create()
        saver.save(tmp_path, 5, run=RUN, objects=objects, write_pretrained=write_config)
        for t in ema.values():  # training goes on: the files must hold the save step's shadow
            t.add_(100.0)
        path = saver.wait().path
        saver.close()
        ema = {k: saved[k] for k in ema}
    else:
        path = save_checkpoint(tmp_path, 5, run=RUN, objects=objects, write_pretrained=write_config)
    paths = CheckpointPaths(path)
    assert paths.pretrained_model_ema.name == "pretrained_model_ema"
    assert (paths.pretrained_model_ema / "config.json").is_file()  # loadable like pretrained_model/
    tensors, _ = read_tensors(paths.ema.model_weights)
    live, _ = read_tensors(paths.model_weights)
    assert set(tensors) == set(live)
    assert torch.equal(tensors["body.weight"], ema["body.weight"])
    assert torch.equal(tensors["emb.weight"], ema["emb.weight"]) and torch.equal(
        tensors["head.weight"], ema["emb.weight"]
    )
    assert all(torch.equal(saved[k], ema[k]) for k in ema)
    assert torch.equal(tensors["frozen.weight"], model.frozen.weight)  # never trained: its EMA is itself
    assert torch.equal(tensors["scale"], model.scale)
    assert not torch.equal(tensors["body.weight"], live["body.weight"])
    record = json.loads(paths.training_step.read_text())
    assert record["artifacts"]["ema_safetensors"] and not record["artifacts"]["ema_dcp"]

    other = Net(seed=1)
    restored = shadow_of(other, 0.0)
    state = load_checkpoint(path, objects=TrainingObjects(model=other, ema=restored))
    assert state.ema_restored
    assert all(torch.equal(restored[k], ema[k]) for k in ema)
    assert restored["emb.weight"] is restored["head.weight"]
    assert torch.equal(other.body.weight, model.body.weight)  # the live weights come from pretrained_model/


def test_checkpoint_without_ema_leaves_the_shadow_and_says_so(tmp_path):
    model = Net()
    path = save_checkpoint(tmp_path, 1, run=RUN, objects=TrainingObjects(model=model))
    assert not CheckpointPaths(path).pretrained_model_ema.exists()
    shadow = shadow_of(Net(seed=1), 0.0)
    before = {k: v.clone() for k, v in shadow.items()}
    state = load_checkpoint(path, objects=TrainingObjects(model=Net(seed=1), ema=shadow))
    assert not state.ema_restored
    assert all(torch.equal(shadow[k], before[k]) for k in shadow)


def test_adapter_selection_saves_and_restores_the_adapters_only(tmp_path):
    """A PEFT run's shadow covers the adapters; its files are keyed as the adapter file."""
    model = Net()
    model.emb.requires_grad_(False)
    model.frozen.requires_grad_(False)
    ema = shadow_of(model, 0.5)
    assert set(ema) == {"body.weight", "body.bias"}

    def adapter_state(sd):  # like get_peft_model_state_dict: select, rename, keep the tensors
        return {f"base.{k}": v for k, v in sd.items() if k.startswith("body.")}

    path = save_checkpoint(
        tmp_path, 2, run=RUN, objects=TrainingObjects(model=model, ema=ema), adapter_state=adapter_state
    )
    paths = CheckpointPaths(path)
    tensors, _ = read_tensors(paths.ema.adapter_weights)
    assert set(tensors) == {"base.body.weight", "base.body.bias"}
    assert torch.equal(tensors["base.body.weight"], ema["body.weight"])
    assert not paths.ema.model_weights.exists()
    other = Net(seed=3)
    other.emb.requires_grad_(False)
    restored = shadow_of(other, 0.0)
    assert load_checkpoint(
        path, objects=TrainingObjects(model=other, ema=restored), adapter_state=adapter_state
    ).ema_restored
    assert all(torch.equal(restored[k], ema[k]) for k in ema)


def test_a_shadow_that_does_not_fit_is_refused_before_anything_changes(tmp_path):
    model = Net()
    path = save_checkpoint(
        tmp_path, 1, run=RUN, objects=TrainingObjects(model=model, ema=shadow_of(model, 1.0))
    )
    other = Net(seed=1)
    wrong = {"body.weight": torch.zeros(3, 3)}
    before = other.body.weight.detach().clone()
    with pytest.raises(ModelMismatchError, match="body.weight"):
        load_checkpoint(path, objects=TrainingObjects(model=other, ema=wrong))
    assert torch.equal(other.body.weight, before)
    with pytest.raises(CheckpointSaveError, match="1 EMA entries are not in the model's state dict: nope"):
        save_checkpoint(
            tmp_path / "b", 1, run=RUN, objects=TrainingObjects(model=model, ema={"nope": torch.zeros(1)})
        )
