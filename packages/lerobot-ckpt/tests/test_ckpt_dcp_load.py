"""A DCP checkpoint resumed by one process without a process group, and refused before any change.

The checkpoint is written the way accelerate's ``save_fsdp_model`` / ``save_fsdp_optimizer`` lay it
out (``{"model": ...}`` in ``pytorch_model_fsdp_0/``, ``{"optimizer": ...}`` in ``optimizer_0/``),
here from a plain model in this process; multi-rank shards are covered by
tests/test_ckpt_sharded_resume.py.
"""

import random

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from lerobot_ckpt import (
    CorruptCheckpointError,
    MissingCheckpointFileError,
    ModelMismatchError,
    OptimizerMismatchError,
    Parallelism,
    RunInfo,
    TrainingObjects,
    load_checkpoint,
    write_tensors,
)
from lerobot_ckpt.state import rng
from lerobot_ckpt.state.record import Artifacts, TrainingStepRecord, write_record
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

# DCP warns that it saves "in a single process" when no process group exists: that is the point here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _model(width=7):
    return nn.Sequential(nn.Linear(5, width), nn.ReLU(), nn.Linear(width, 3))


def _trained():
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(2):
        model(torch.randn(4, 5)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


@pytest.fixture
def saved(tmp_path):
    model, opt = _trained()
    step = tmp_path / "checkpoints" / "000002"
    pm, ts = step / "pretrained_model", step / "training_state"
    pm.mkdir(parents=True)
    ts.mkdir()
    dcp.save(
        {"model": get_model_state_dict(model)},
        storage_writer=dcp.FileSystemWriter(pm / "pytorch_model_fsdp_0"),
        no_dist=True,
    )
    dcp.save(
        {"optimizer": get_optimizer_state_dict(model, opt)},
        storage_writer=dcp.FileSystemWriter(ts / "optimizer_0"),
        no_dist=True,
    )
    write_tensors(ts / "rng_state.safetensors", rng.pack([rng.capture()]))
    run = RunInfo(world_size=2, batch_size=4, parallelism=Parallelism(1, 2), checkpoint_format="dcp")
    write_record(
        ts / "training_step.json",
        TrainingStepRecord.for_run(
            run,
            step=2,
            artifacts=Artifacts(model_dcp=True, optimizer_dcp=True),
            sampler={"offset": 8},
            versions={},
        ),
    )
    return step, {k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict()


def _same_optimizer(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        for name, value in a["state"][i].items():
            assert torch.equal(value, b["state"][i][name]), (i, name)


def test_dcp_checkpoint_resumes_bitwise_in_one_process_without_a_process_group(saved):
    step, weights, optim = saved
    assert not torch.distributed.is_initialized()
    torch.manual_seed(5)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    state = load_checkpoint(step, objects=TrainingObjects(model=model, optimizer=opt))
    assert state.step == 2 and state.sampler_state == {"offset": 8} and state.rng_restored
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    _same_optimizer(optim, opt.state_dict())
    model(torch.randn(4, 5)).pow(2).mean().backward()  # and training goes on
    opt.step()
    assert int(opt.state_dict()["state"][0]["step"]) == 3


def test_a_loaded_optimizer_without_state_is_restored_even_after_a_backward(saved):
    step, _, optim = saved
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    model(torch.randn(2, 5)).sum().backward()  # gradients present, no optimizer state yet
    grads = [p.grad.clone() for p in model.parameters()]
    load_checkpoint(step, objects=TrainingObjects(model=model, optimizer=opt), restore_rng=False)
    _same_optimizer(optim, opt.state_dict())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))


def _garble(path):
    """Random bytes of the same size: every size check passes, nothing in it is a record."""
    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))


def _snapshot(model, opt):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        repr(opt.state_dict()),
        torch.get_rng_state(),
        random.getstate(),
        np.random.get_state()[1].copy(),
    )


def _unchanged(before, model, opt):
    after = _snapshot(model, opt)
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0]) and before[1] == after[1]
    assert torch.equal(before[2], after[2]) and before[3] == after[3] and (before[4] == after[4]).all()


@pytest.mark.parametrize(
    ("break_it", "error", "match"),
    [
        (
            lambda step: None,
            ModelMismatchError,
            r"pytorch_model_fsdp_0 does not match the model: .*another shape",
        ),
        (
            lambda step: (step / "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp").unlink(),
            MissingCheckpointFileError,
            "shard file.s. missing or truncated: __0_0.distcp is missing",
        ),
        (
            lambda step: (step / "training_state/optimizer_0/.metadata").unlink(),
            MissingCheckpointFileError,
            "optimizer_0/ has no .metadata",
        ),
        (
            lambda step: _garble(step / "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp"),
            CorruptCheckpointError,
            (
                r"pytorch_model_fsdp_0/__0_0.distcp: the record of model\.\S+ at byte \d+ "
                r"is not a torch.save record"
            ),
        ),
        (
            lambda step: _garble(step / "training_state/optimizer_0/__0_0.distcp"),
            CorruptCheckpointError,
            r"optimizer_0/__0_0.distcp: the record of optimizer\.\S+ at byte \d+ is not a torch.save record",
        ),
    ],
)
def test_refusals_happen_before_anything_changes(saved, break_it, error, match):
    step, _, _ = saved
    break_it(step)
    model = _model(width=8 if error is ModelMismatchError else 7)
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    before = _snapshot(model, opt)
    with pytest.raises(error, match=match):
        load_checkpoint(step, objects=TrainingObjects(model=model, optimizer=opt))
    _unchanged(before, model, opt)
    assert not opt.state  # torch's state initialisation did not run either


def test_a_record_damaged_inside_is_one_corrupt_checkpoint_error_not_a_dcp_dump(saved):
    """Damage the framing checks cannot see (inside a record's pickle) fails in DCP's read: translated."""
    from lerobot_ckpt.dcp.index import DcpIndex

    step, _, _ = saved
    shards = step / "pretrained_model/pytorch_model_fsdp_0"
    chunk = DcpIndex.read(shards).tensors[0].chunks[0]
    data = bytearray((shards / chunk.file).read_bytes())
    data[chunk.start + 60 : chunk.start + 90] = b"\xff" * 30
    (shards / chunk.file).write_bytes(bytes(data))
    model = _model()
    with pytest.raises(
        CorruptCheckpointError,
        match=r"pytorch_model_fsdp_0: rank 0 could not decode a shard "
        r"\(UnpicklingError: [^)]*\); the files were damaged",
    ):
        load_checkpoint(
            step, objects=TrainingObjects(model=model, optimizer=torch.optim.AdamW(model.parameters()))
        )


def test_optimizer_of_another_model_is_refused(saved):
    step, _, _ = saved
    model = _model()
    opt = torch.optim.AdamW([{"params": model[0].parameters()}, {"params": model[2].parameters()}], lr=0.5)
    with pytest.raises(OptimizerMismatchError, match="optimizer_0 has 1 param group.s., the optimizer 2"):
        load_checkpoint(step, objects=TrainingObjects(model=model, optimizer=opt))
    assert not opt.state
