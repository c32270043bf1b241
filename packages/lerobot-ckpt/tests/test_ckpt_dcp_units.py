"""The pieces under the sharded path: the streaming safetensors writer, the weights-file check for
``--policy.path``, and errors re-raised on peer ranks with their own class."""

import pytest
import torch
from lerobot_ckpt import MissingCheckpointFileError, UnsupportedCheckpointError
from lerobot_ckpt._collective import _rebuild
from lerobot_ckpt.errors import CheckpointWriteError, CorruptCheckpointError
from lerobot_ckpt.pretrained import pretrained_weights_file
from lerobot_ckpt.safetensors.stream import SafetensorsPlan, SafetensorsStreamWriter
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def _tensors():
    g = torch.Generator().manual_seed(1)
    return {
        "b": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "a": torch.randn(9, 4, generator=g),
        "i": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "s": torch.tensor(2.5, dtype=torch.float64),
        "flag": torch.tensor([True, False]),
        "none": torch.zeros(0, 7),
    }


def test_streamed_file_in_row_slabs_any_order_reads_back_with_safetensors(tmp_path):
    tensors = _tensors()
    plan = SafetensorsPlan.build(((k, v.dtype, tuple(v.shape)) for k, v in tensors.items()), {"format": "pt"})
    assert [s.name for s in plan.slots] == ["i", "s", "a", "none", "b", "flag"]  # save_file's order
    writer = SafetensorsStreamWriter(tmp_path / "m.safetensors", plan)
    writer.write("a", tensors["a"][6:], row=6)  # the last rows first
    writer.write("a", tensors["a"][:6])
    for k in ("b", "i", "s", "flag", "none"):
        writer.write(k, tensors[k])
    writer.close()
    back = load_file(tmp_path / "m.safetensors")
    assert back.keys() == tensors.keys()
    assert all(back[k].dtype == v.dtype and torch.equal(back[k], v) for k, v in tensors.items())
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    assert (tmp_path / "m.safetensors").stat().st_size == plan.total_size
    save_file(tensors, tmp_path / "reference.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "m.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()


def test_stream_writer_refuses_wrong_dtype_overflow_and_an_incomplete_file(tmp_path):
    x = torch.ones(4, 2)
    writer = SafetensorsStreamWriter(
        tmp_path / "m.safetensors", SafetensorsPlan.build([("x", x.dtype, (4, 2))])
    )
    with pytest.raises(TypeError, match="writing torch.float64 into a torch.float32 slot"):
        writer.write("x", x.double())
    with pytest.raises(ValueError, match="do not fit shape"):
        writer.write("x", x[:2], row=3)
    writer.write("x", x[:2])
    with pytest.raises(OSError, match="wrote 16 of 32 data bytes"):
        writer.close()


def test_pretrained_weights_file_points_dcp_only_checkpoints_to_the_converter(tmp_path):
    step = tmp_path / "005000"
    pm = step / "pretrained_model"
    (pm / "pytorch_model_fsdp_0").mkdir(parents=True)
    with pytest.raises(UnsupportedCheckpointError) as info:
        pretrained_weights_file(step)
    assert str(info.value) == (
        f"{pm} holds its weights only as DCP shards (pytorch_model_fsdp_0/, written by "
        "checkpoint_format=dcp), which cannot be loaded as a pretrained model; convert them first: "
        f"lerobot-convert-dcp --checkpoint_dir={pm}"
    )
    (pm / "adapter_model.safetensors").write_bytes(b"")
    assert pretrained_weights_file(pm) == pm / "adapter_model.safetensors"
    (pm / "model.safetensors").write_bytes(b"")
    assert pretrained_weights_file(step) == pm / "model.safetensors"
    with pytest.raises(MissingCheckpointFileError, match="no model.safetensors or adapter_model.safetensors"):
        pretrained_weights_file(tmp_path)


def test_peer_errors_are_rebuilt_with_their_class():
    missing = _rebuild("MissingCheckpointFileError", "checkpoint file missing: x")
    assert type(missing) is MissingCheckpointFileError and str(missing) == "checkpoint file missing: x"
    assert missing.path is None
    write = _rebuild("CheckpointWriteError", "rank 1: could not write y")
    assert type(write) is CheckpointWriteError and write.path is None and write.os_error is None
    assert type(_rebuild("CorruptCheckpointError", "z")) is CorruptCheckpointError
    assert type(_rebuild("KeyError", "not ours")).__name__ == "CheckpointSaveError"
