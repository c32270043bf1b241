"""Where a stored DCP chunk's raw tensor bytes sit in its shard file, so they can be copied, not decoded.

Each chunk is a ``torch.save`` record: an uncompressed zip holding ``data.pkl`` (how to rebuild the
tensor: storage key, dtype, offset, size, stride) and ``data/<key>`` (the storage bytes). For a
contiguous tensor the bytes it needs are one range of the shard file; the converter copies that
range into the output inside the kernel (``copy_file_range``) or reads it into a reused buffer,
instead of ``torch.load`` allocating a fresh tensor per chunk. That is what keeps conversion both
faster than a full load and at about zero extra memory.

Only the standard library reads the record (``zipfile`` for the layout, a restricted unpickler
that knows the three globals ``torch.save`` emits for a tensor and refuses anything else), so
locating bytes imports no torch (dtypes are :class:`lerobot_ckpt._dtypes.DType`). Any record that
does not look exactly like that (compressed, big-endian, non-contiguous, unknown pickle content)
yields None and the caller falls back to ``torch.load``.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import zipfile
from collections import OrderedDict

from attrs import define

from lerobot_ckpt._dtypes import DTYPES, DType, by_name
from lerobot_ckpt.dcp.index import StoredChunk, _Window

_STORAGE_DTYPES = {
    storage: DTYPES[name]
    for storage, name in {
        "DoubleStorage": "float64",
        "FloatStorage": "float32",
        "HalfStorage": "float16",
        "BFloat16Storage": "bfloat16",
        "LongStorage": "int64",
        "IntStorage": "int32",
        "ShortStorage": "int16",
        "CharStorage": "int8",
        "ByteStorage": "uint8",
        "BoolStorage": "bool",
        "ComplexFloatStorage": "complex64",
        "ComplexDoubleStorage": "complex128",
    }.items()
}
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zip local file header, 30 bytes


@define(frozen=True)
class RawTensor:
    """A contiguous tensor's bytes: ``nbytes`` at absolute ``offset`` of the shard file."""

    offset: int
    nbytes: int
    dtype: DType
    shape: tuple[int, ...]


@define(frozen=True)
class _Storage:
    key: str
    dtype: DType | None  # None for an untyped storage (the dtype comes with _rebuild_tensor_v3)


@define(frozen=True)
class _Rebuilt:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: DType


def _rebuild_v2(storage, storage_offset, size, stride, *_rest):
    return _Rebuilt(storage, int(storage_offset), tuple(size), tuple(stride), storage.dtype)


def _rebuild_v3(storage, storage_offset, size, stride, _requires_grad, _hooks, dtype, *_rest):
    return _Rebuilt(storage, int(storage_offset), tuple(size), tuple(stride), dtype)


class ForeignPickle(pickle.UnpicklingError):
    """A record's pickle names a global or persistent id that plain checkpoint data never holds: the
    mark of a crafted (or foreign) record, whose unpickling by a general loader could run code."""


class _TensorRecordUnpickler(pickle.Unpickler):
    """Understands a pickled tensor and nothing else (no code runs; unknown globals raise)."""

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_v2
        if module == "torch._utils" and name == "_rebuild_tensor_v3":
            return _rebuild_v3
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        if module == "torch.storage" and name == "UntypedStorage":
            return None
        if module == "torch" and (dtype := by_name(name)) is not None:
            return dtype
        raise ForeignPickle(f"the global {module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ForeignPickle(f"the persistent id {str(pid)[:60]}")
        return _Storage(str(pid[2]), pid[1])


def _contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for dim, st in zip(reversed(size), reversed(stride), strict=True):
        if dim != 1 and st != expected:
            return False
        expected *= dim
    return True


def _data_start(window: _Window, info: zipfile.ZipInfo) -> int:
    window.seek(info.header_offset)
    fields = _LOCAL_HEADER.unpack(window.read(_LOCAL_HEADER.size))
    if fields[0] != b"PK\x03\x04":
        raise zipfile.BadZipFile("bad local header")
    name_len, extra_len = fields[-2], fields[-1]
    return info.header_offset + _LOCAL_HEADER.size + name_len + extra_len


def _parse(window: _Window) -> tuple[_Rebuilt, zipfile.ZipInfo, int] | None:
    """The record's rebuild call, its storage entry and where the storage bytes start; None when the
    record is not a plain little-endian, uncompressed tensor record. Raises :class:`ForeignPickle` when its
    pickle names a global or persistent id a tensor record never holds (see :func:`check_tensor_record`)."""
    with zipfile.ZipFile(window) as archive:
        names = archive.namelist()
        pkl = next((n for n in names if n == "data.pkl" or n.endswith("/data.pkl")), None)
        if pkl is None:
            return None
        prefix = pkl[: -len("data.pkl")]
        order = archive.read(prefix + "byteorder").decode() if prefix + "byteorder" in names else "little"
        if order != sys.byteorder:
            return None
        rebuilt = _TensorRecordUnpickler(io.BytesIO(archive.read(pkl))).load()
        if not isinstance(rebuilt, _Rebuilt):
            return None
        info = archive.getinfo(f"{prefix}data/{rebuilt.storage.key}")
        if info.compress_type != zipfile.ZIP_STORED:
            return None
        return rebuilt, info, _data_start(window, info)


def check_tensor_record(raw: io.RawIOBase, chunk: StoredChunk) -> str | None:
    """Why the record of ``chunk`` is not a plain tensor record (the global or persistent id its pickle
    names), or None. Only :class:`ForeignPickle` counts: a record that is merely unusual (compressed,
    other byte order) or damaged is left to ``torch.load(weights_only=True)``, which reads or refuses it
    without running code."""
    try:
        _parse(_Window(raw, chunk.start, chunk.length))
    except ForeignPickle as exc:
        return str(exc)
    except (
        zipfile.BadZipFile,
        pickle.UnpicklingError,
        KeyError,
        ValueError,
        TypeError,
        EOFError,
        struct.error,
    ):
        return None
    return None


def locate(raw: io.RawIOBase, chunk: StoredChunk, dtype: DType) -> RawTensor | None:
    """The chunk's bytes in the open shard file ``raw``, or None when only ``torch.load`` can read it."""
    try:
        parsed = _parse(_Window(raw, chunk.start, chunk.length))
    except (
        zipfile.BadZipFile,
        pickle.UnpicklingError,
        KeyError,
        ValueError,
        TypeError,
        EOFError,
        struct.error,
    ):
        return None
    if parsed is None:
        return None
    rebuilt, info, start = parsed
    numel = 1
    for d in rebuilt.size:
        numel *= d
    nbytes = numel * rebuilt.dtype.itemsize
    first = rebuilt.offset * rebuilt.dtype.itemsize
    if (
        rebuilt.dtype != dtype
        or rebuilt.size != chunk.sizes
        or not _contiguous(rebuilt.size, rebuilt.stride)
        or first + nbytes > info.file_size
    ):
        return None
    return RawTensor(chunk.start + start + first, nbytes, rebuilt.dtype, rebuilt.size)
