"""The torch-side reader every ``dcp.load`` here uses (:mod:`lerobot_ckpt.dcp.safe_reader`), tested by
itself rather than behind ``load_dcp``'s checks.

``load_dcp`` checks ``.metadata`` before torch reads it, so a test through it alone passes with the
reader's own allow-list removed. Here the reader meets the crafted file itself: directly, and as a file
swapped between ``load_dcp``'s check and the load (or a shard swapped for a symlink after the reader
checked its name). Its tolerance of a newer torch's ``TensorProperties`` state is dead code under the
lock's torch (it pickles exactly the fields it reads), so a state with one field more is made here.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from lerobot_ckpt.dcp import save_load
from lerobot_ckpt.dcp.safe_reader import SafePlanner, SafeReader, _TensorProperties, _TorchMetadataUnpickler
from lerobot_ckpt.dcp.save_load import load_dcp
from lerobot_ckpt.errors import UnsupportedCheckpointError
from lerobot_ckpt.paths import UnsafePathError
from torch import nn
from torch.distributed.checkpoint.metadata import TensorProperties

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted import MODEL_DCP, edit_metadata, exploit_metadata, save_weights, set_storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

FOREIGN = r"\.metadata: the DCP metadata refers to posix\.system.*could run arbitrary code"


@pytest.fixture
def pair(tmp_path):
    """(ours, theirs): the weight shards of two models with different weights."""
    ours = save_weights(tmp_path / "ours" / "000002", 0) / MODEL_DCP
    return ours, save_weights(tmp_path / "theirs" / "000002", 1) / MODEL_DCP


def _targets() -> dict[str, torch.Tensor]:
    return {
        k: torch.zeros_like(v)
        for k, v in nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).state_dict().items()
    }


def test_the_reader_itself_refuses_a_foreign_global(pair, tmp_path):
    ours, _ = pair
    marker = tmp_path / "ran-code"
    exploit_metadata(ours, marker)
    with pytest.raises(UnsupportedCheckpointError, match=FOREIGN):
        SafeReader(ours).read_metadata()
    with pytest.raises(dcp.api.CheckpointException) as caught:  # torch's load, our reader
        dcp.load(
            {"model": _targets()}, storage_reader=SafeReader(ours), planner=SafePlanner(ours), no_dist=True
        )
    # torch fails the load on "metadata is None" after it tried a rank-local metadata file (also refused);
    # from 2.12 its message carries the reader's refusal, 2.11 (LeRobot's) drops it
    ((exc, _trace),) = caught.value.failures.values()
    assert isinstance(exc, (UnsupportedCheckpointError, AssertionError)), exc
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 12):
        assert "posix.system" in str(exc), exc
    assert not marker.exists()


def test_a_metadata_swapped_after_load_dcps_check_is_refused_by_the_reader(pair, tmp_path, monkeypatch):
    """``load_dcp`` checked a clean ``.metadata``; a crafted one then takes its place before torch reads."""
    ours, _ = pair
    marker = tmp_path / "ran-code"
    checked = save_load.load_metadata

    def check_then_swap(path):
        metadata = checked(path)
        exploit_metadata(ours, marker)
        return metadata

    monkeypatch.setattr(save_load, "load_metadata", check_then_swap)
    targets = _targets()
    with pytest.raises(UnsupportedCheckpointError, match=FOREIGN):
        load_dcp(ours, "model", targets, collective=False)
    assert not marker.exists()
    assert all(not t.any() for t in targets.values())


def test_a_refused_metadata_is_not_replaced_by_a_rank_file(pair, tmp_path, monkeypatch):
    """torch falls back to ``__<rank>.metadata`` when ``.metadata`` cannot be read: after a refusal the
    reader refuses that too (a crafted ``.metadata`` beside a clean rank file would otherwise load), and
    ``load_dcp`` reports the refusal, not torch's "metadata is None"."""
    ours, _ = pair
    marker = tmp_path / "ran-code"
    (ours / "__0.metadata").write_bytes((ours / ".metadata").read_bytes())  # a clean one beside it
    checked = save_load.load_metadata

    def check_then_swap(path):
        metadata = checked(path)
        exploit_metadata(ours, marker)
        return metadata

    monkeypatch.setattr(save_load, "load_metadata", check_then_swap)
    targets = _targets()
    with pytest.raises(UnsupportedCheckpointError, match=FOREIGN):
        load_dcp(ours, "model", targets, collective=False)
    assert all(not t.any() for t in targets.values()) and not marker.exists()


def test_the_reader_refuses_a_relative_path_outside_its_directory(pair):
    ours, theirs = pair
    edit_metadata(ours, lambda m: set_storage(m, "relative_path", lambda p: str(theirs / p)))
    with pytest.raises(
        UnsafePathError, match=r"\.metadata: the relative_path of model\.\S+ = '/.*is an absolute"
    ):
        SafeReader(ours).read_metadata()
    metadata = pickle.loads((ours / ".metadata").read_bytes())  # as a coordinator would broadcast it
    with pytest.raises(UnsafePathError, match="is an absolute path"):
        SafeReader(ours).set_up_storage_reader(metadata, False)


def test_a_shard_swapped_for_a_symlink_after_the_check_is_not_followed(pair, monkeypatch):
    """The reader's names passed; then a shard becomes a symlink to another checkpoint's. torch opens
    files through the reader's file system, which refuses it rather than loading their weights."""
    ours, theirs = pair
    checked = SafeReader.read_metadata

    def check_then_swap(self, *args, **kwargs):
        metadata = checked(self, *args, **kwargs)
        for shard in ours.glob("*.distcp"):
            shard.unlink()
            shard.symlink_to(theirs / shard.name)
        return metadata

    monkeypatch.setattr(SafeReader, "read_metadata", check_then_swap)
    targets = _targets()
    with pytest.raises(UnsafePathError, match=r"a relative_path = '__0_0\.distcp' is a symlink"):
        load_dcp(ours, "model", targets, collective=False)
    assert all(not t.any() for t in targets.values())


def test_a_newer_torchs_tensor_properties_state_is_read(pair, monkeypatch):
    """A newer torch pickles one more field than the running one knows (2.12 added ``strides``): the
    reader keeps the fields it knows. torch's own class refuses the same state."""
    ours, _ = pair
    known = len(dataclasses.fields(TensorProperties))
    pickled = TensorProperties.__getstate__
    monkeypatch.setattr(TensorProperties, "__getstate__", lambda self: (*pickled(self), "a future field"))
    data = pickle.dumps(pickle.loads((ours / ".metadata").read_bytes()))
    monkeypatch.undo()
    with pytest.raises((ValueError, TypeError)):
        pickle.loads(data)  # torch's TensorProperties.__setstate__ on known + 1 fields
    metadata = _TorchMetadataUnpickler(io.BytesIO(data)).load()
    props = metadata.state_dict_metadata["model.0.weight"].properties
    assert props.dtype == torch.float32 and props.requires_grad is False
    direct = _TensorProperties.__new__(_TensorProperties)
    direct.__setstate__((*pickled(props), "a future field"))
    names = [f.name for f in dataclasses.fields(TensorProperties)]
    assert len(names) == known and [getattr(direct, n) for n in names] == [getattr(props, n) for n in names]
