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
