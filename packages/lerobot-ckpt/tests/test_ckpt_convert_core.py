"""``convert_dcp`` on single-process DCP checkpoints: content, --dtype, --delete_dcp, PEFT, memory, errors.

The multi-rank shards of real FSDP2/HSDP runs (uneven chunks, ties, accelerate's merge on the same
shards) are converted in tests/test_ckpt_sharded_resume.py; here the checkpoints are written with
``torch.distributed.checkpoint`` in this process, so every case costs milliseconds.
"""

import json
import os
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from lerobot_ckpt import (
    CheckpointError,
    CorruptCheckpointError,
    MissingCheckpointFileError,
    Parallelism,
    RunInfo,
    TrainingObjects,
    convert_dcp,
    load_checkpoint,
    read_training_step,
)
from lerobot_ckpt.errors import InsufficientDiskSpaceError, OutputExistsError
from lerobot_ckpt.state.record import Artifacts, TrainingStepRecord, write_record
from safetensors.torch import load_file
from torch import nn

# DCP warns that it saves "in a single process" when no process group exists: that is the point here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state():
    g = torch.Generator().manual_seed(0)
    return {
        "enc.weight": torch.randn(7, 5, generator=g),
        "enc.bias": torch.randn(7, generator=g),
        "head.weight": torch.randn(3, 7, generator=g).to(torch.bfloat16),
        "norm.running_mean": torch.randn(7, generator=g, dtype=torch.float64),
        "norm.num_batches_tracked": torch.tensor(12, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
    }


def make_checkpoint(root, state=None, *, peft=False, record=True):
    """A step directory like a `dcp` sharded run leaves it (weights as DCP only)."""
    step = root / "checkpoints" / "000010"
    pm, ts = step / "pretrained_model", step / "training_state"
    pm.mkdir(parents=True)
    ts.mkdir()
    dcp.save(
        {"model": state if state is not None else _state()},
        storage_writer=dcp.FileSystemWriter(pm / "pytorch_model_fsdp_0"),
        no_dist=True,
    )
    (pm / "config.json").write_text("{}")
    if peft:
        (pm / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    if record:
        run = RunInfo(world_size=2, batch_size=1, parallelism=Parallelism(1, 2), checkpoint_format="dcp")
        write_record(
            ts / "training_step.json",
            TrainingStepRecord.for_run(
                run,
                step=10,
                artifacts=Artifacts(model_dcp=True, optimizer_dcp=True, peft_adapter=peft),
                sampler={},
                versions={},
            ),
        )
    return step


def _raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_output_equals_the_shards_bitwise_in_their_dtypes_and_the_record_learns_of_it(tmp_path):
    step = make_checkpoint(tmp_path)
    seen = []
    result = convert_dcp(step, progress=seen.append)
    out = load_file(step / "pretrained_model" / "model.safetensors")
    expected = _state()
    assert out.keys() == expected.keys()
    for k, v in expected.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape and torch.equal(_raw(out[k]), _raw(v)), k
    assert result.tensors == 7 and not result.verified and not result.deleted_dcp and result.record_updated
    assert [p.tensors_done for p in seen] == list(range(1, 8)) and seen[-1].bytes_done == seen[-1].bytes_total
    assert (step / "pretrained_model" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    art = read_training_step(step).artifacts
    assert art.model_safetensors and art.model_dcp  # both now; loaders still prefer the shards
    assert sorted(os.listdir(step / "pretrained_model")) == [
        "config.json",
        "model.safetensors",
        "pytorch_model_fsdp_0",
    ]  # no temporary left


@pytest.mark.parametrize("route", ["torch.load fallback", "no copy_file_range"])
def test_every_copy_route_writes_the_same_file(tmp_path, monkeypatch, route):
    """Records the raw locator does not recognise go through torch.load; file systems without
    copy_file_range get plain reads and writes. Both give the file the kernel copy gives."""
    import errno

    import lerobot_ckpt.convert.merge as convert_module
    import lerobot_ckpt.safetensors.stream as stream_module

    reference = make_checkpoint(tmp_path / "a")
    convert_dcp(reference)
    step = make_checkpoint(tmp_path / "b")
    if route == "torch.load fallback":
        monkeypatch.setattr(convert_module.dcp_raw, "locate", lambda *a: None)
    else:

        def unsupported(*a):
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(stream_module.os, "copy_file_range", unsupported)
    convert_dcp(step)
    name = "pretrained_model/model.safetensors"
    assert (step / name).read_bytes() == (reference / name).read_bytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_dtype_casts_floating_tensors_only(tmp_path, dtype):
    step = make_checkpoint(tmp_path)
    convert_dcp(step / "pretrained_model", dtype=dtype)  # the pretrained_model/ directory works too
    out = load_file(step / "pretrained_model" / "model.safetensors")
    want = getattr(torch, dtype)
    for k, v in _state().items():
        if v.is_floating_point():
            assert out[k].dtype == want and torch.equal(_raw(out[k]), _raw(v.to(want))), k
        else:
            assert out[k].dtype == v.dtype and torch.equal(out[k], v), k


def test_delete_dcp_verifies_then_removes_the_shards_and_the_checkpoint_still_loads(tmp_path):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    step = make_checkpoint(tmp_path, {k: v.clone() for k, v in model.state_dict().items()})
    result = convert_dcp(step, delete_dcp=True)
    assert result.verified and result.deleted_dcp and result.record_updated
    assert sorted(os.listdir(step / "pretrained_model")) == ["config.json", "model.safetensors"]
    art = read_training_step(step).artifacts
    assert art.model_safetensors and not art.model_dcp and art.optimizer_dcp
    fresh = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    load_checkpoint(step, objects=TrainingObjects(model=fresh), restore_rng=False)
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True)
    )


def test_delete_dcp_keeps_the_shards_when_verification_fails(tmp_path, monkeypatch):
    import lerobot_ckpt.convert.merge as convert_module

    step = make_checkpoint(tmp_path)
    real = convert_module.SafetensorsStreamWriter.copy_range

    def corrupt(self, name, *args, **kwargs):  # a flipped bit on its way to disk
        n = real(self, name, *args, **kwargs)
        if name == "enc.weight":
            at = self.plan.data_start + self.plan[name].begin
            with open(self.path, "r+b") as f:
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ 1]))
        return n

    monkeypatch.setattr(convert_module.SafetensorsStreamWriter, "copy_range", corrupt)
    with pytest.raises(CorruptCheckpointError, match="enc.weight differs from the shards"):
        convert_dcp(step, delete_dcp=True)
    assert sorted(os.listdir(step / "pretrained_model")) == ["config.json", "pytorch_model_fsdp_0"]
    assert not read_training_step(step).artifacts.model_safetensors


def test_peft_checkpoint_becomes_adapter_model_safetensors(tmp_path):
    lora = {
        "base_model.model.fc.lora_A.weight": torch.randn(2, 5),
        "base_model.model.fc.lora_B.weight": torch.zeros(7, 2),
    }
    step = make_checkpoint(tmp_path, lora, peft=True)
    result = convert_dcp(step)
    assert result.output.name == "adapter_model.safetensors"
    out = load_file(result.output)
    assert out.keys() == lora.keys() and all(torch.equal(out[k], v) for k, v in lora.items())
    assert not (step / "pretrained_model" / "model.safetensors").exists()


# ----------------------------------------------------------------------------------------- errors
def test_no_dcp_directory_says_which_formats_write_one(tmp_path):
    pm = tmp_path / "pretrained_model"
    pm.mkdir()
    (pm / "model.safetensors").write_bytes(b"x")
    with pytest.raises(MissingCheckpointFileError) as info:
        convert_dcp(tmp_path)
    msg = str(info.value)
    assert "pytorch_model_fsdp_0" in msg and "--checkpoint_format=dcp" in msg and "safetensors_dcp" in msg
    assert "already has model.safetensors" in msg


def test_missing_and_truncated_shards_are_named(tmp_path):
    state = {f"w{i}": torch.randn(64, 64) for i in range(3)}
    step = make_checkpoint(tmp_path, state)
    shards = step / "pretrained_model" / "pytorch_model_fsdp_0"
    only = shards / "__0_0.distcp"
    size = only.stat().st_size
    with open(only, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(
        MissingCheckpointFileError,
        match=rf"__0_0.distcp is truncated \({size - 100} bytes, the "
        rf"metadata needs ≥ {size}\)",
    ):
        convert_dcp(step)
    only.unlink()
    with pytest.raises(
        MissingCheckpointFileError, match="1 shard file.s. missing or truncated: __0_0.distcp is missing"
    ):
        convert_dcp(step)
    (shards / ".metadata").unlink()
    with pytest.raises(MissingCheckpointFileError, match="pytorch_model_fsdp_0/ has no .metadata"):
        convert_dcp(step)
    assert not (step / "pretrained_model" / "model.safetensors").exists()


def test_garbage_inside_a_shard_is_reported_as_corrupt(tmp_path):
    step = make_checkpoint(tmp_path, {"w": torch.randn(32, 32)})
    shard = step / "pretrained_model" / "pytorch_model_fsdp_0" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[:64] = b"\0" * 64  # the zip header of the tensor record
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="__0_0.distcp.*cannot decode w"):
        convert_dcp(step)
    assert sorted(os.listdir(step / "pretrained_model")) == ["config.json", "pytorch_model_fsdp_0"]


def test_existing_output_needs_overwrite(tmp_path):
    step = make_checkpoint(tmp_path)
    weights = step / "pretrained_model" / "model.safetensors"
    weights.write_bytes(b"old")
    with pytest.raises(OutputExistsError, match="model.safetensors already exists; pass --overwrite"):
        convert_dcp(step)
    assert weights.read_bytes() == b"old"
    convert_dcp(step, overwrite=True)
    assert load_file(weights).keys() == _state().keys()


def test_not_enough_disk_space_is_refused_before_writing(tmp_path, monkeypatch):
    import lerobot_ckpt.convert.merge as convert_module

    step = make_checkpoint(tmp_path)
    real = shutil.disk_usage
    monkeypatch.setattr(
        convert_module.shutil, "disk_usage", lambda p: real(p)._replace(free=1_000_000)
    )  # a nearly full disk
    with pytest.raises(
        InsufficientDiskSpaceError,
        match=r"not enough free disk space for .*model.safetensors: it "
        r"needs .* \(\+67.11 MB reserve\), .* has 1.00 MB free",
    ):
        convert_dcp(step)
    assert sorted(os.listdir(step / "pretrained_model")) == ["config.json", "pytorch_model_fsdp_0"]


def test_every_converter_error_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError):
        convert_dcp(tmp_path / "nope")
    with pytest.raises(ValueError, match="dtype must be one of bfloat16, float16, float32"):
        convert_dcp(tmp_path, dtype="int8")


def test_a_step_without_record_converts_and_says_so(tmp_path):
    step = make_checkpoint(tmp_path, record=False)
    result = convert_dcp(step)
    assert not result.record_updated and result.output.is_file()
    assert json.loads((step / "pretrained_model" / "config.json").read_text()) == {}
