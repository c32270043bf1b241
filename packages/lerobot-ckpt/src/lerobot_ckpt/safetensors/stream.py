"""A safetensors file written tensor by tensor (or chunk by chunk), never held whole in memory.

``safetensors.torch.save_file`` needs every tensor at once, which is the model twice on the main
rank of a gathered save and the whole model in the offline converter. The format itself does not:
its header lists each tensor's dtype, shape and byte range, and all of those follow from shapes and
dtypes alone. So :class:`SafetensorsPlan` lays the file out from ``(name, dtype, shape)`` triples,
and :class:`SafetensorsStreamWriter` writes the header first, then each tensor's bytes at their
offsets with ``pwrite`` (chunks of one tensor may arrive in any order). The result is the file
``save_file`` writes for the same tensors, byte for byte: same compact JSON header padded with
spaces to 8 bytes, same tensor order.

Torch-free at import: dtypes may be ``torch.dtype`` (the gathered save) or
:class:`lerobot_ckpt._dtypes.DType` (the offline converter, which copies raw bytes with
``copy_file_range`` and casts bytes with :mod:`lerobot_ckpt.convert.cast`, so it never needs torch);
only :class:`ReusableBuffer` and :meth:`SafetensorsStreamWriter.write` touch torch objects.
"""

from __future__ import annotations

import errno
import json
import math
import os
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from attrs import define, field

from lerobot_ckpt._dtypes import DType, dtype_of, torch_dtype

if TYPE_CHECKING:
    import torch

    AnyDType = torch.dtype | DType

RESERVED_NAME = "__metadata__"  # the header key of the file's string metadata, never a tensor's name
FORMAT_METADATA = {"format": "pt"}  # what transformers/LeRobot expect in a PyTorch safetensors header
# safetensors' Dtype enum order; save_file lays tensors out by it (descending), then by name, which
# puts wider types first and keeps every tensor aligned. Same order here, so the files are identical.
_DTYPE_ORDER = (
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
)
HEADER_ALIGN = 8
_MAX_PWRITE = 1 << 30  # Linux writes at most ~2 GiB per call; stay well below


def dtype_code(dtype: AnyDType, name: str = "") -> str:
    try:
        code = dtype_of(dtype).code
    except TypeError:
        code = None
    if code is None:
        raise TypeError(f"{name or 'tensor'}: dtype {dtype} cannot be stored in safetensors")
    return code


@define(frozen=True)
class TensorSlot:
    """Where one tensor's bytes live, relative to the start of the data section."""

    name: str
    dtype: AnyDType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def row_bytes(self) -> int:
        """Bytes of one index along dim 0: a dim-0 slab of rows is one contiguous byte range."""
        if not self.shape:
            return self.nbytes
        return math.prod(self.shape[1:]) * self.dtype.itemsize


def _ordered(specs: Iterable[tuple[str, AnyDType, tuple[int, ...]]]):
    return sorted(specs, key=lambda s: (-_DTYPE_ORDER.index(dtype_code(s[1], s[0])), s[0]))


@define(frozen=True)
class SafetensorsPlan:
    """The layout of a file: header bytes and one slot per tensor, in file order."""

    header: bytes
    slots: tuple[TensorSlot, ...]
    _by_name: dict[str, TensorSlot] = field(repr=False, eq=False)

    @classmethod
    def build(
        cls, specs: Iterable[tuple[str, AnyDType, tuple[int, ...]]], metadata: Mapping[str, str] | None = None
    ) -> SafetensorsPlan:
        slots, offset = [], 0
        entries: dict[str, object] = {}
        if metadata:
            entries["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        for name, dtype, shape in _ordered(specs):
            if name == RESERVED_NAME:
                raise ValueError(f"a tensor cannot be named {RESERVED_NAME!r}: safetensors reserves that key")
            if name in entries:
                raise ValueError(f"tensor name {name!r} appears twice")
            size = math.prod(shape) * dtype.itemsize
            shape = tuple(int(d) for d in shape)
            entries[name] = {
                "dtype": dtype_code(dtype, name),
                "shape": list(shape),
                "data_offsets": [offset, offset + size],
            }
            slots.append(TensorSlot(name, dtype, shape, offset, offset + size))
            offset += size
        text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % HEADER_ALIGN)
        header = struct.pack("<Q", len(text)) + text
        return cls(header, tuple(slots), {s.name: s for s in slots})

    def __getitem__(self, name: str) -> TensorSlot:
        return self._by_name[name]

    @property
    def data_start(self) -> int:
        return len(self.header)

    @property
    def total_size(self) -> int:
        return self.data_start + (self.slots[-1].end if self.slots else 0)


class ReusableBuffer:
    """One byte buffer per device, sized once for the largest tensor and viewed as each tensor in turn.

    Allocating a fresh tensor per item makes glibc keep much of the freed memory (its mmap threshold
    adapts upwards), so RSS creeps towards the model size; a reused buffer keeps it flat.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._bufs: dict[torch.device, torch.Tensor] = {}

    def view(self, device: torch.device | str, dtype: AnyDType, shape: tuple[int, ...]) -> torch.Tensor:
        import torch

        device, dtype = torch.device(device), torch_dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.capacity:
            raise ValueError(f"{nbytes} bytes do not fit a {self.capacity}-byte buffer")
        buf = self._bufs.get(device)
        if buf is None:
            buf = self._bufs[device] = torch.empty(self.capacity, dtype=torch.uint8, device=device)
        return buf[:nbytes].view(dtype).view(shape)


class ByteBuffer:
    """:class:`ReusableBuffer` for raw bytes (no torch): one ``bytearray``, sized once, viewed per item."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._buf: bytearray | None = None

    def view(self, nbytes: int) -> memoryview:
        if nbytes > self.capacity:
            raise ValueError(f"{nbytes} bytes do not fit a {self.capacity}-byte buffer")
        if self._buf is None:
            self._buf = bytearray(self.capacity)
        return memoryview(self._buf)[:nbytes]


def pread_into(fd: int, target: torch.Tensor | bytearray | memoryview, offset: int) -> None:
    """Fill a contiguous CPU tensor (or a writable byte buffer)
    with its size in bytes of ``fd`` at ``offset``."""
    view = memoryview(target).cast("B") if isinstance(target, bytearray | memoryview) else raw_bytes(target)
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done : done + _MAX_PWRITE]], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"unexpected end of file reading {len(view)} bytes at {offset}")
        done += n


def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy when it is already a contiguous CPU tensor."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


def _preallocate(fd: int, size: int) -> None:
    """Reserve the blocks up front: a full disk fails here, before any data is written."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class SafetensorsStreamWriter:
    """Write a planned file; every byte range must be written once, then :meth:`close`.

    The file is created exclusively (``O_EXCL | O_NOFOLLOW``: ``FileExistsError`` when anything has
    the name), or ``fd`` is a new file the caller created itself (``mkstemp``); it never writes
    through a symlink or into an existing file that someone else could have planted there. The
    writer owns ``fd`` from then on (closes it on :meth:`close`, :meth:`abort` or a failed start)."""

    def __init__(self, path: Path | str, plan: SafetensorsPlan, *, fd: int | None = None) -> None:
        self.path = Path(path)
        self.plan = plan
        self._written = 0
        self._fd = os.open(self.path, _CREATE, 0o644) if fd is None else fd
        try:
            _preallocate(self._fd, plan.total_size)
            self._pwrite(memoryview(plan.header), 0)
        except BaseException:
            os.close(self._fd)
            raise

    def _pwrite(self, data: memoryview, position: int) -> None:
        data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        done = 0
        while done < len(data):
            n = os.pwrite(self._fd, data[done : done + _MAX_PWRITE], position + done)
            if n <= 0:
                raise OSError(errno.EIO, f"short write to {self.path}")
            done += n

    def write(self, name: str, tensor: torch.Tensor, *, row: int = 0) -> int:
        """Write ``tensor`` into ``name``'s slot starting at dim-0 index ``row``; returns bytes written.

        ``tensor`` must already have the slot's dtype and be a dim-0 slab of it (all other dims full).
        """
        if dtype_of(tensor.dtype) != dtype_of(self.plan[name].dtype):
            raise TypeError(f"{name}: writing {tensor.dtype} into a {self.plan[name].dtype} slot")
        return self.write_bytes(name, raw_bytes(tensor), tuple(tensor.shape), row=row)

    def write_bytes(self, name: str, data: memoryview, shape: tuple[int, ...], *, row: int = 0) -> int:
        """:meth:`write` for the bytes of a dim-0 slab of ``shape`` already in the slot's dtype (no torch)."""
        slot = self.plan[name]
        start = slot.begin + row * slot.row_bytes
        if start + len(data) > slot.end or tuple(shape[1:]) != slot.shape[1:]:
            raise ValueError(f"{name}: rows {row}..+{shape} do not fit shape {slot.shape}")
        self._pwrite(data, self.plan.data_start + start)
        self._written += len(data)
        return len(data)

    def copy_range(self, name: str, src_fd: int, src_offset: int, nbytes: int, *, row: int = 0) -> int:
        """Copy ``nbytes`` of another file into ``name``'s slot at dim-0 index ``row``, in the kernel
        (``copy_file_range``: no user-space copy, no memory); plain reads and writes where unsupported."""
        slot = self.plan[name]
        start = slot.begin + row * slot.row_bytes
        if start + nbytes > slot.end:
            raise ValueError(f"{name}: {nbytes} bytes from row {row} do not fit shape {slot.shape}")
        position, done = self.plan.data_start + start, 0
        while done < nbytes:
            try:
                n = os.copy_file_range(
                    src_fd, self._fd, min(nbytes - done, _MAX_PWRITE), src_offset + done, position + done
                )
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
                    raise
                n = self._copy_by_reading(src_fd, src_offset + done, position + done, nbytes - done)
            if n <= 0:
                raise OSError(errno.EIO, f"{name}: source ended after {done} of {nbytes} bytes")
            done += n
        self._written += nbytes
        return nbytes

    def _copy_by_reading(self, src_fd: int, src: int, dst: int, count: int) -> int:
        block = bytearray(min(count, 8 << 20))
        done = 0
        while done < count:
            n = os.preadv(src_fd, [memoryview(block)[: min(len(block), count - done)]], src + done)
            if n <= 0:
                break
            self._pwrite(memoryview(block)[:n], dst + done)
            done += n
        return done

    def close(self, *, sync: bool = True) -> None:
        """Check every data byte was written, then fsync and close (always closes)."""
        try:
            expected = self.plan.total_size - self.plan.data_start
            if self._written != expected:
                raise OSError(errno.EIO, f"{self.path}: wrote {self._written} of {expected} data bytes")
            if sync:
                os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
