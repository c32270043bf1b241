"""Read what a DCP directory stores without ever running code from it: checkpoints are shared.

DCP stores each non-tensor entry (an optimizer's param-group fields: ``lr``, ``betas``, ``params``)
as a ``torch.save`` record of a pickle, and torch's own ``DefaultLoadPlanner.load_bytes`` decodes
it with ``torch.load(weights_only=False)``: a crafted record runs any command on load. Plain
checkpoint data never needs a global to unpickle (numbers, strings, booleans, ``None``, lists,
tuples and dicts are pickle opcodes of their own), so :func:`decode_plain` allows none but
``collections.OrderedDict`` and no persistent ids. It is standard library only, so the torch-free
converter uses it too.

:func:`check_untrusted` looks at every record of a directory before anything is loaded: byte
entries are decoded this way (and returned, so callers can validate the values), tensor records
have their pickle parsed by :mod:`lerobot_ckpt.dcp.raw`'s tensor-only unpickler. A record naming
anything else is refused with :class:`UnsafeCheckpointError`, naming the file and the entry.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from lerobot_ckpt.dcp.index import DcpIndex, PathKey, _Window
from lerobot_ckpt.dcp.raw import ForeignPickle, check_tensor_record
from lerobot_ckpt.errors import CorruptCheckpointError, UnsafeCheckpointError


class _PlainUnpickler(pickle.Unpickler):
    """Plain data only: no global but ``OrderedDict``, no persistent id, so nothing can run."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        raise ForeignPickle(f"the global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise ForeignPickle(f"the persistent id {str(pid)[:60]}")


def _refused(file: Path, where: str, why: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{file}: the entry {where} is not plain checkpoint data (its pickle names {why}); "
        "it was not loaded, because unpickling it could run code: use a checkpoint written by lerobot-train "
        "or torch.distributed.checkpoint from a source you trust"
    )


def decode_plain(record: io.RawIOBase | bytes, where: str, file: Path) -> Any:
    """The value of one ``torch.save`` record of plain data (a DCP byte entry).

    :class:`UnsafeCheckpointError` when its pickle names a global or persistent id;
    :class:`CorruptCheckpointError` when it is not a readable record at all; ``file`` is named in both."""
    source = io.BytesIO(record) if isinstance(record, bytes | bytearray) else record
    try:
        with zipfile.ZipFile(source) as archive:
            pkl = next((n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")), None)
            if pkl is None:
                raise CorruptCheckpointError(file, f"the record of {where} holds no data.pkl")
            return _PlainUnpickler(io.BytesIO(archive.read(pkl))).load()
    except ForeignPickle as exc:
        raise _refused(file, where, str(exc)) from None
    except (
        zipfile.BadZipFile,
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        IndexError,
        RecursionError,
    ) as exc:
        raise CorruptCheckpointError(
            file, f"cannot decode the record of {where}: {type(exc).__name__}: {exc}"
        ) from None


def check_untrusted(index: DcpIndex) -> dict[PathKey, Any]:
    """Every record of ``index`` checked as described above; the decoded byte entries by path.

    Run after :meth:`DcpIndex.check_files` (the ranges read here must exist). Reads each tensor
    record's zip directory and small pickle, not its tensor bytes; each shard file is opened by
    :meth:`DcpIndex.open_shard` (inside the directory, never through a symlink)."""
    plain: dict[PathKey, Any] = {}
    for name, records in sorted(index.records_by_file().items()):
        with index.open_shard(name, records[0][0], buffering=0) as raw:
            for where, chunk, path in sorted(records, key=lambda item: item[1].start):
                if path is not None:
                    window = _Window(raw, chunk.start, chunk.length)
                    plain[path] = decode_plain(window, where, index.directory / name)
                elif (why := check_tensor_record(raw, chunk)) is not None:
                    raise _refused(index.directory / name, where, why)
    return plain
