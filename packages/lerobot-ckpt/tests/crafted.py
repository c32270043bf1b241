"""Crafted DCP files for the untrusted-checkpoint tests: records whose unpickling would run a command.

:class:`Exploit` pickles to ``os.system("touch <marker>")``; a test passes when the marker never
appears. :func:`replace_record` swaps one entry's record inside a shard file (shifting the offsets of
the records after it in ``.metadata``), the way an attacker edits a checkpoint written by a real run.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import torch


class Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = Path(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def exploit_record(marker: Path) -> bytes:
    """A ``torch.save`` record (what DCP stores per entry) whose pickle calls ``os.system``."""
    buffer = io.BytesIO()
    torch.save(Exploit(marker), buffer)
    return buffer.getvalue()


def replace_record(dcp_dir: Path, fqn: str, record: bytes) -> None:
    """Put ``record`` in place of the stored record of ``fqn`` (a flattened DCP key, e.g.
    ``optimizer.param_groups.0.lr`` or ``model.0.weight``; the first chunk of a tensor)."""
    meta_path = Path(dcp_dir) / ".metadata"
    metadata = pickle.loads(meta_path.read_bytes())  # our own test file, written by torch
    index = next(i for i in metadata.storage_data if i.fqn == fqn)
    info = metadata.storage_data[index]
    shard = Path(dcp_dir) / info.relative_path
    data = shard.read_bytes()
    shard.write_bytes(data[: info.offset] + record + data[info.offset + info.length :])
    delta = len(record) - info.length
    for other in metadata.storage_data.values():
        if other.relative_path == info.relative_path and other.offset > info.offset:
            other.offset += delta
    info.length = len(record)
    meta_path.write_bytes(pickle.dumps(metadata))


def exploit_metadata(dcp_dir: Path, marker: Path) -> None:
    """``.metadata`` that runs the command when unpickled by a plain ``pickle.load``."""
    (Path(dcp_dir) / ".metadata").write_bytes(pickle.dumps(Exploit(marker)))


MODEL_DCP = "pretrained_model/pytorch_model_fsdp_0"


def save_weights(step: Path, seed: int) -> Path:
    """A step directory holding only DCP weight shards (what the converter reads), written by torch's
    ``dcp.save``: ``Sequential(Linear(5, 7), ReLU, Linear(7, 3))`` (every tensor of another shape)."""
    import torch.distributed.checkpoint as dcp
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    dcp.save(
        {"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(step / MODEL_DCP), no_dist=True
    )
    return step


def edit_metadata(dcp_dir: Path, edit) -> None:
    """Rewrite ``dcp_dir/.metadata`` after ``edit(metadata)`` changed torch's own ``Metadata`` in place
    (e.g. a chunk's ``relative_path``), the way an attacker edits a checkpoint a real save wrote."""
    meta_path = Path(dcp_dir) / ".metadata"
    metadata = pickle.loads(meta_path.read_bytes())  # our own test file, written by torch
    edit(metadata)
    meta_path.write_bytes(pickle.dumps(metadata))


def set_storage(metadata, field: str, value, fqn: str | None = None) -> None:
    """Set ``field`` of every storage entry (or of the entries of ``fqn``): value may be a function of
    the old value."""
    for index, info in metadata.storage_data.items():
        if fqn is None or index.fqn == fqn:
            setattr(info, field, value(getattr(info, field)) if callable(value) else value)


def duplicate_storage(metadata, fqn: str, other_fqn: str) -> None:
    """A second storage entry for the chunk of ``fqn`` (same fqn and offset, another ``index``), pointing at
    ``other_fqn``'s record. A pickled dict can repeat a key; a dict built in Python cannot, so the key is
    a :class:`_DupKey` that pickles as an ordinary ``MetadataIndex``."""
    import copy

    index = next(i for i in metadata.storage_data if i.fqn == fqn)
    other = next(v for i, v in metadata.storage_data.items() if i.fqn == other_fqn)
    key = _DupKey(index.fqn, index.offset, 99)
    metadata.storage_data = {**metadata.storage_data, key: copy.copy(other)}


class _DupKey:
    """Hashes by identity, pickles as ``MetadataIndex(fqn, offset, index)`` (NEWOBJ + BUILD, as DCP's)."""

    def __init__(self, fqn, offset, index) -> None:
        self.fqn, self.offset, self.index = fqn, offset, index

    @property
    def __class__(self):  # what pickle checks NEWOBJ's class against
        from torch.distributed.checkpoint.metadata import MetadataIndex

        return MetadataIndex

    def __reduce_ex__(self, protocol):
        import copyreg

        from torch.distributed.checkpoint.metadata import MetadataIndex

        state = {"fqn": self.fqn, "offset": self.offset, "index": self.index}
        return copyreg.__newobj__, (MetadataIndex,), state
