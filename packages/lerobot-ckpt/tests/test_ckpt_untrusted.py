"""A checkpoint is untrusted input: nothing in it runs code, a crafted entry is refused in one line
before anything changes, and values that would silently change training are checked.

The checkpoints are written by torch's own ``dcp.save`` (accelerate's layout), then edited the way an
attacker would: an optimizer param-group entry, a model tensor record or ``.metadata`` replaced by a
pickle that runs ``touch <marker>`` (:mod:`crafted`). The marker proves nothing ran. Resumes through
``lerobot-train`` on 1 and 2 processes (EMA shards too): tests/test_crafted_checkpoints.py.
"""

import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from lerobot_ckpt import (
    CorruptCheckpointError,
    ModelMismatchError,
    Parallelism,
    RunInfo,
    TrainingObjects,
    UnsafeCheckpointError,
    UnsupportedCheckpointError,
    convert_dcp,
    load_checkpoint,
    save_checkpoint,
    write_tensors,
)
from lerobot_ckpt.dcp.index import OPTIMIZER_KEY
from lerobot_ckpt.dcp.save_load import load_dcp
from lerobot_ckpt.paths import UnsafePathError
from lerobot_ckpt.state import rng
from lerobot_ckpt.state.record import Artifacts, TrainingStepRecord, write_record
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted import Exploit, edit_metadata, exploit_metadata, exploit_record, replace_record, set_storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _model():
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def _save(step: Path, *, groups=None) -> None:
    """A 2-step AdamW run saved as DCP shards; ``groups`` edits the saved param groups first."""
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randn(4, 5)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    pm, ts = step / "pretrained_model", step / "training_state"
    pm.mkdir(parents=True)
    ts.mkdir()
    dcp.save(
        {"model": get_model_state_dict(model)},
        storage_writer=dcp.FileSystemWriter(pm / "pytorch_model_fsdp_0"),
        no_dist=True,
    )
    osd = get_optimizer_state_dict(model, opt)
    if groups is not None:
        groups(osd["param_groups"][0])
    dcp.save({OPTIMIZER_KEY: osd}, storage_writer=dcp.FileSystemWriter(ts / "optimizer_0"), no_dist=True)
    write_tensors(ts / "rng_state.safetensors", rng.pack([rng.capture()]))
    run = RunInfo(world_size=2, batch_size=4, parallelism=Parallelism(1, 2), checkpoint_format="dcp")
    write_record(
        ts / "training_step.json",
        TrainingStepRecord.for_run(
            run, step=2, artifacts=Artifacts(model_dcp=True, optimizer_dcp=True), sampler={}, versions={}
        ),
    )


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "ran-code"


@pytest.fixture
def step(tmp_path):
    path = tmp_path / "checkpoints" / "000002"
    _save(path)
    return path


def _fresh():
    model = _model()
    return model, torch.optim.AdamW(model.parameters(), lr=0.5)


def _state(model, opt):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        repr(opt.state_dict()),
        torch.get_rng_state(),
        random.getstate(),
        np.random.get_state()[1].copy(),
    )


def _refused_unchanged(step, error, match):
    model, opt = _fresh()
    before = _state(model, opt)
    with pytest.raises(error, match=match) as info:
        load_checkpoint(step, objects=TrainingObjects(model=model, optimizer=opt))
    after = _state(model, opt)
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0]) and before[1] == after[1]
    assert torch.equal(before[2], after[2]) and before[3] == after[3] and (before[4] == after[4]).all()
    assert "\n" not in str(info.value)
    return str(info.value)


UNSAFE = (
    r"the entry {} is not plain checkpoint data \(its pickle names the global posix\.system\); it was not "
    r"loaded, because unpickling it could run code"
)


@pytest.mark.parametrize(
    ("where", "fqn"),
    [
        (
            "training_state/optimizer_0",
            "optimizer.param_groups.0.lr",
        ),  # a DCP byte item (torch: weights_only=False)
        ("training_state/optimizer_0", "optimizer.param_groups.0.params"),
        ("training_state/optimizer_0", "optimizer.state.0.weight.exp_avg"),  # a tensor record
        ("pretrained_model/pytorch_model_fsdp_0", "model.2.bias"),
    ],
)
def test_a_crafted_record_is_refused_before_anything_changes_and_runs_nothing(step, marker, where, fqn):
    replace_record(step / where, fqn, exploit_record(marker))
    message = _refused_unchanged(step, UnsafeCheckpointError, UNSAFE.format(fqn.replace(".", r"\.")))
    assert f"{step / where}/__0_0.distcp" in message
    assert not marker.exists()


def test_crafted_metadata_is_refused_and_runs_nothing(step, marker):
    exploit_metadata(step / "training_state/optimizer_0", marker)
    _refused_unchanged(
        step,
        UnsupportedCheckpointError,
        r"optimizer_0/\.metadata: the DCP metadata refers to "
        r"posix\.system.*could run arbitrary code",
    )
    assert not marker.exists()


def test_the_load_itself_runs_no_code_even_without_the_checks(step, marker):
    """``load_dcp`` (what the resume runs after its checks) refuses on its own: a file changed after
    the checks, or a caller that skips them, still runs nothing (torch's reader and planner would)."""
    model, opt = _fresh()
    opt_dir = step / "training_state/optimizer_0"
    replace_record(opt_dir, "optimizer.param_groups.0.lr", exploit_record(marker))
    target = get_optimizer_state_dict(model, opt)
    with pytest.raises(UnsafeCheckpointError, match=UNSAFE.format(r"optimizer\.param_groups\.0\.lr")):
        load_dcp(opt_dir, OPTIMIZER_KEY, target, collective=False)
    model_dir = step / "pretrained_model/pytorch_model_fsdp_0"
    exploit_metadata(model_dir, marker)
    with pytest.raises(UnsupportedCheckpointError, match=r"pytorch_model_fsdp_0/\.metadata: .*posix\.system"):
        load_dcp(model_dir, "model", get_model_state_dict(model), collective=False)
    assert not marker.exists()


def _point_outside(step: Path, where: str, theirs: Path, how: str) -> None:
    """``step/where``'s chunks read from ``theirs/where``: by an absolute relative_path (with no shard
    file left in ``step``) or by symlinked shard files."""
    if how == "absolute path":
        outside = theirs / where
        edit_metadata(step / where, lambda m: set_storage(m, "relative_path", lambda p: str(outside / p)))
        for shard in (step / where).glob("*.distcp"):
            shard.unlink()
    else:
        for shard in (step / where).glob("*.distcp"):
            shard.unlink()
            shard.symlink_to(theirs / where / shard.name)


@pytest.mark.parametrize("how", ["absolute path", "symlinked shard"])
@pytest.mark.parametrize("where", ["pretrained_model/pytorch_model_fsdp_0", "training_state/optimizer_0"])
def test_a_shard_outside_the_checkpoint_is_refused_on_resume(tmp_path, how, where):
    """A resume used to load another checkpoint's weights (or optimizer state) this way and train from
    them; now one line names the directory's ``.metadata`` and the entry, and nothing changes."""
    step, theirs = tmp_path / "ours" / "000002", tmp_path / "theirs" / "000002"
    _save(step)
    _save(theirs)
    _point_outside(step, where, theirs, how)
    why = "is an absolute path" if how == "absolute path" else "is a symlink"
    message = _refused_unchanged(step, UnsafePathError, why)
    if how == "absolute path":
        assert f"{step / where / '.metadata'}: the relative_path of " in message
    else:  # a symlink in the checkpoint is refused by name before the metadata is read
        assert f"{step / where}/" in message, message


@pytest.mark.parametrize("where", ["pretrained_model/pytorch_model_fsdp_0", "training_state/optimizer_0"])
def test_a_symlinked_shard_directory_is_refused_on_resume(tmp_path, where):
    """The whole directory linked to another checkpoint's used to be resumed from (exit 0)."""
    step, theirs = tmp_path / "ours" / "000002", tmp_path / "theirs" / "000002"
    _save(step)
    _save(theirs)
    shutil.rmtree(step / where)
    (step / where).symlink_to(theirs / where)
    message = _refused_unchanged(step, UnsafePathError, "is a symlink")
    assert f"{step / where} is a symlink" in message, message


def test_a_non_tensor_model_entry_is_refused(tmp_path):
    path = tmp_path / "000002"
    _save(path)
    model_dir = path / "pretrained_model/pytorch_model_fsdp_0"
    state = {"model": {**get_model_state_dict(_model()), "extra": {"a": 1}}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(model_dir, overwrite=True), no_dist=True)
    _refused_unchanged(
        path,
        ModelMismatchError,
        r"holds non-tensor model entries \(model\.extra\.a\); model weights "
        r"are tensors only",
    )


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda g: g.update(lr="0.01"),
            r"param group 0's lr is '0\.01', not a number; the optimizer holds 0\.5",
        ),
        (lambda g: g.update(lr=None), r"param group 0's lr is None, not a number"),
        (lambda g: g.update(lr=-1e-3), r"param group 0's lr is -0\.001, which is negative"),
        (lambda g: g.update(lr=float("nan")), r"param group 0's lr is nan, not a finite number"),
        (lambda g: g.update(lr=True), r"param group 0's lr is True, not a number"),
        (lambda g: g.update(betas=(0.9,)), r"param group 0's betas is \(0\.9,\), not 2 values"),
        (lambda g: g.update(amsgrad=0), r"param group 0's amsgrad is 0, not a boolean"),
    ],
)
def test_param_group_values_of_the_wrong_kind_are_refused(tmp_path, edit, match):
    """Plain data, so nothing runs, yet trained with silently: a string ``lr`` or ``None`` must not
    pass, and neither may a negative or non-finite rate."""
    path = tmp_path / "000002"
    _save(path, groups=edit)
    message = _refused_unchanged(path, CorruptCheckpointError, match)
    assert "training_state/optimizer_0" in message


def test_the_json_param_groups_are_checked_the_same_way(tmp_path):
    """The non-sharded layout stores param groups as JSON: no pickle, but the same value checks."""
    model, opt = _fresh()
    model(torch.randn(2, 5)).sum().backward()
    opt.step()
    run = RunInfo(world_size=1, batch_size=4, parallelism=Parallelism(1, 1))
    path = save_checkpoint(
        tmp_path / "out",
        step=1,
        run=run,
        objects=TrainingObjects(model=model, optimizer=opt),
        sampler_state={},
    )
    groups_file = path / "training_state" / "optimizer_param_groups.json"
    groups = json.loads(groups_file.read_text())
    groups[0]["lr"] = "0.5"
    groups_file.write_text(json.dumps(groups))
    message = _refused_unchanged(path, CorruptCheckpointError, r"param group 0's lr is '0\.5', not a number")
    assert str(groups_file) in message


def test_a_legitimate_checkpoint_still_loads(step):
    model, opt = _fresh()
    load_checkpoint(step, objects=TrainingObjects(model=model, optimizer=opt))
    assert opt.param_groups[0]["lr"] == 1e-2 and opt.param_groups[0]["betas"] == (0.9, 0.999)


@pytest.mark.parametrize("crafted", ["record", "metadata"])
def test_the_converter_refuses_crafted_shards_writes_nothing_and_runs_nothing(step, marker, crafted):
    shards = step / "pretrained_model/pytorch_model_fsdp_0"
    if crafted == "record":
        replace_record(shards, "model.0.weight", exploit_record(marker))
        error, match = UnsafeCheckpointError, UNSAFE.format(r"model\.0\.weight")
    else:
        exploit_metadata(shards, marker)
        error, match = UnsupportedCheckpointError, r"\.metadata: the DCP metadata refers to posix\.system"
    with pytest.raises(error, match=match):
        convert_dcp(step)
    assert not marker.exists()
    assert sorted(p.name for p in (step / "pretrained_model").iterdir()) == ["pytorch_model_fsdp_0"]


def test_the_exploit_is_real(tmp_path, marker):
    """The crafted record does run its command under a plain ``torch.load``: the refusals above matter."""
    import io

    torch.load(io.BytesIO(exploit_record(marker)), weights_only=False)
    assert marker.exists()
    assert Exploit(marker).__reduce__()[1] == (f"touch {marker}",)


def test_the_converter_refuses_a_non_tensor_weight_entry_and_writes_nothing(tmp_path):
    """Converting only the tensors would drop the entry silently (it used to, exit 0)."""
    path = tmp_path / "000002"
    _save(path)
    model_dir = path / "pretrained_model/pytorch_model_fsdp_0"
    state = {"model": {**get_model_state_dict(_model()), "extra": 3}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(model_dir, overwrite=True), no_dist=True)
    with pytest.raises(
        CorruptCheckpointError,
        match=r"pytorch_model_fsdp_0: 1 weight entry is not a tensor "
        r"\(model\.extra\); weight shards hold tensors only",
    ):
        convert_dcp(path)
    assert sorted(p.name for p in (path / "pretrained_model").iterdir()) == ["pytorch_model_fsdp_0"]
