"""What a DCP directory holds, read from its ``.metadata`` alone, and one stored chunk at a time.

``torch.distributed.checkpoint`` writes ``.metadata`` (pickled: every tensor's global shape and
dtype, the chunks it was saved in, and each chunk's file/offset/length) plus the shard files
``__<rank>_<n>.distcp``, where each chunk is a small ``torch.save`` record. Reading the metadata
lets us check a checkpoint completely before touching anything (keys and shapes against a
model, every shard file present and long enough) and lets the offline converter load one chunk
at a time instead of the whole state (``_EmptyStateDictLoadPlanner`` materialises everything).

The layout read here is DCP's own, as ``FileSystemWriter`` (default ``TORCH_SAVE`` serialisation,
no stream extensions) writes it in torch 2.x; anything else is refused with a clear error.

Torch-free at import: ``.metadata`` is read by :mod:`lerobot_ckpt.dcp.metadata` (a restricted
unpickler with stand-ins for DCP's classes, so no torch and no code from the file runs) and
dtypes are :class:`lerobot_ckpt._dtypes.DType`, so the offline converter's default path, which only
copies bytes, never pays the ~0.6 GB a CUDA build of torch costs. Only decoding a chunk with
``torch.load`` (:meth:`ChunkReader.read` and the helpers built on it) imports torch.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from attrs import define

from lerobot_ckpt._dtypes import DType, dtype_of
from lerobot_ckpt._torch import require_torch
from lerobot_ckpt.dcp.metadata import load_metadata
from lerobot_ckpt.errors import (
    CheckpointError,
    CorruptCheckpointError,
    MissingCheckpointFileError,
    UnsupportedCheckpointError,
)
from lerobot_ckpt.paths import LinkedLayoutError, UnsafePathError, check_name, open_inside, resolve_inside

if TYPE_CHECKING:
    import torch

METADATA_FILE = ".metadata"
MODEL_KEY = "model"  # the one top-level key of each DCP directory (accelerate's nesting)
OPTIMIZER_KEY = "optimizer"
PathKey = tuple[str | int, ...]
_ZIP_HEAD = b"PK\x03\x04"  # a zip local file header: how every torch.save record starts
_ZIP_END = b"PK\x05\x06"  # the end-of-central-directory signature, in a record's last 22 bytes (no comment)
_ZIP_END_SIZE = 22
_RECORD_MIN = 30 + _ZIP_END_SIZE  # one local header and the end record


def _dotted(path: PathKey) -> str:
    return ".".join(str(p) for p in path)


def _read_at(f, offset: int, n: int = 4) -> bytes:
    f.seek(offset)
    return f.read(n)


def _path_entry(fqn: object) -> str:
    """How :class:`~lerobot_ckpt.paths.UnsafePathError` names a storage entry's file name."""
    return f"the relative_path of {str(fqn)[:120]}"


def _byte_count(value: object, what: str, fqn: object, meta_path: Path) -> int:
    """A storage entry's byte offset or length as a non-negative int, or one line saying it is not."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptCheckpointError(
            meta_path, f"the record of {fqn} has the byte {what} {value!r}, which is not an integer"
        )
    if value < 0:
        raise CorruptCheckpointError(
            meta_path,
            f"the record of {fqn} has a bad byte {what}: {value} is negative, where a record starts at or "
            "after byte 0 of its shard file; the metadata was edited or damaged after the save",
        )
    return value


def check_storage(metadata: Any, meta_path: Path) -> dict[tuple[str, tuple[int, ...] | None], Any]:
    """``metadata.storage_data`` keyed by ``(fqn, chunk offset)``, every entry checked before any shard
    byte is read: its ``relative_path`` a plain relative name inside the directory
    (:func:`lerobot_ckpt.paths.check_name`: no absolute path, no ``..``, no NUL), its byte offset and
    length non-negative integers, and no chunk stored twice (a pickled dict may repeat a key, so
    which record was read would depend on the reader).

    Shared by :class:`DcpIndex` (every torch-free read) and the torch-side
    :class:`~lerobot_ckpt.dcp.safe_reader.SafeReader`, so both follow the same rule."""
    storage: dict[tuple[str, tuple[int, ...] | None], Any] = {}
    for index, info in (metadata.storage_data or {}).items():
        fqn = index.fqn
        key = (fqn, None if index.offset is None else tuple(index.offset))
        if key in storage:
            raise CorruptCheckpointError(
                meta_path,
                f"the chunk of {fqn} at {key[1]} has two storage entries; a save writes one per chunk, "
                "so the metadata was edited after the save",
            )
        check_name(getattr(info, "relative_path", None), named_by=meta_path, entry=_path_entry(fqn))
        _byte_count(getattr(info, "offset", None), "offset", fqn, meta_path)  # None fields are not pickled
        _byte_count(getattr(info, "length", None), "length", fqn, meta_path)
        storage[key] = info
    return storage


def _check_chunk(
    key: str, offsets: tuple[int, ...], sizes: tuple[int, ...], shape: tuple[int, ...], meta_path: Path
) -> None:
    """A chunk's place lies inside its tensor (a negative or out-of-range one would make the
    assembly write outside the tensor or read rows that are not there)."""
    if not (len(offsets) == len(sizes) == len(shape)) or any(
        o < 0 or s < 0 or o + s > d for o, s, d in zip(offsets, sizes, shape, strict=True)
    ):
        raise CorruptCheckpointError(
            meta_path,
            f"a chunk of {key} claims offsets {offsets} and sizes {sizes}, which do not lie inside "
            f"its shape {shape}; the metadata was edited or damaged after the save",
        )


@define(frozen=True)
class StoredChunk:
    """One saved piece of a tensor: its place in the global tensor and its bytes on disk."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    start: int
    length: int
    dtype: DType | None = None  # the tensor's, as the metadata says (None: a non-tensor record)

    def is_row_slab(self, shape: tuple[int, ...]) -> bool:
        """True when the chunk is whole along every dim but the first (FSDP's Shard(0) pieces)."""
        return self.sizes[1:] == shape[1:] and all(o == 0 for o in self.offsets[1:])


@define(frozen=True)
class StoredTensor:
    path: PathKey  # e.g. ("model", "encoder.0.weight") or ("optimizer", "state", "fc.weight", "exp_avg")
    dtype: DType  # .torch for the torch.dtype
    shape: tuple[int, ...]
    chunks: tuple[StoredChunk, ...]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


@define(frozen=True)
class DcpIndex:
    """Tensors of one DCP directory (non-tensor entries are counted, not described)."""

    directory: Path
    tensors: tuple[StoredTensor, ...]
    other_paths: tuple[PathKey, ...]
    other_records: tuple[tuple[PathKey, StoredChunk], ...] = ()  # where the non-tensor entries are stored

    @classmethod
    def read(cls, directory: Path) -> DcpIndex:
        directory = Path(directory)
        meta_path = directory / METADATA_FILE
        if directory.is_symlink():  # another checkpoint's shards, read as this one's
            raise LinkedLayoutError(directory, "a DCP shard directory")
        if not directory.is_dir():
            raise MissingCheckpointFileError(directory, "the DCP directory does not exist")
        if not meta_path.is_file():
            raise MissingCheckpointFileError(
                meta_path,
                f"{directory.name}/ has no {METADATA_FILE}: the save that wrote it did not finish "
                "or the directory was copied incompletely",
            )
        metadata = load_metadata(meta_path)
        try:
            return cls.from_metadata(directory, metadata)
        except CheckpointError:
            raise
        except (
            AttributeError,
            TypeError,
            ValueError,
        ) as exc:  # a pickle of the right classes, wrongly filled
            raise CorruptCheckpointError(
                meta_path, f"malformed DCP metadata: {type(exc).__name__}: {exc}"
            ) from None

    @classmethod
    def from_metadata(cls, directory: Path, metadata: Any) -> DcpIndex:
        """The index of a ``Metadata``: the stand-in :func:`load_metadata` returns, or torch's own
        (attribute names are the same; both are read by name, never imported here)."""
        directory = Path(directory)
        meta_path = directory / METADATA_FILE
        planner = metadata.planner_data or {}
        storage = check_storage(metadata, meta_path)
        tensors, others, other_records = [], [], []
        for key, entry in (metadata.state_dict_metadata or {}).items():
            path = tuple(planner.get(key, (key,)))
            if type(entry).__name__ != "TensorStorageMetadata":
                others.append(path)
                if (info := storage.get((key, None))) is not None:
                    other_records.append(
                        (
                            path,
                            StoredChunk((), (), str(info.relative_path), int(info.offset), int(info.length)),
                        )
                    )
                continue
            chunks = []
            try:
                dtype = dtype_of(entry.properties.dtype)
            except TypeError as exc:
                raise CorruptCheckpointError(directory / METADATA_FILE, f"{key}: {exc}") from None
            shape = tuple(int(d) for d in entry.size)
            if any(d < 0 for d in shape):
                raise CorruptCheckpointError(meta_path, f"{key} has the negative shape {shape}")
            for chunk in entry.chunks:
                offsets, sizes = tuple(int(o) for o in chunk.offsets), tuple(int(d) for d in chunk.sizes)
                _check_chunk(key, offsets, sizes, shape, meta_path)
                info = storage.get((key, offsets))
                if info is None:
                    raise CorruptCheckpointError(
                        directory / METADATA_FILE, f"no storage entry for a chunk of {key}"
                    )
                if getattr(info, "transform_descriptors", None):
                    raise UnsupportedCheckpointError(
                        f"{directory}: {key} was saved through DCP stream extensions "
                        f"({', '.join(map(str, info.transform_descriptors))}), "
                        "which lerobot-ckpt does not read"
                    )
                chunks.append(
                    StoredChunk(
                        offsets, sizes, str(info.relative_path), int(info.offset), int(info.length), dtype
                    )
                )
            tensors.append(StoredTensor(path, dtype, shape, tuple(chunks)))
        return cls(directory, tuple(tensors), tuple(others), tuple(other_records))

    def under(self, prefix: str) -> dict[str, StoredTensor]:
        """Tensors nested under ``prefix`` (``"model"`` / ``"optimizer"``), keyed by the rest of the path.

        accelerate and lerobot-ckpt both save ``{"model": state_dict}``, so model keys are FQNs.
        """
        out = {}
        for t in self.tensors:
            if len(t.path) >= 2 and t.path[0] == prefix:
                out[".".join(str(p) for p in t.path[1:])] = t
        return out

    def prefixes(self) -> set[str]:
        return {str(t.path[0]) for t in self.tensors} | {str(p[0]) for p in self.other_paths}

    @property
    def metadata_path(self) -> Path:
        return self.directory / METADATA_FILE

    def open_shard(self, name: str, where: str, *, buffering: int = -1) -> io.BufferedIOBase:
        """Shard file ``name`` (a ``relative_path`` of the metadata, read for the entry ``where``)
        opened under the one rule for names read from files (:func:`lerobot_ckpt.paths.open_inside`):
        a regular file inside this directory, reached without a symlink, opened without following one."""
        return open_inside(
            self.directory, name, named_by=self.metadata_path, entry=_path_entry(where), buffering=buffering
        )

    def records_by_file(self) -> dict[str, list[tuple[str, StoredChunk, PathKey | None]]]:
        """Every stored record by shard file: ``(dotted entry, chunk, path of a non-tensor entry)``."""
        by_file: dict[str, list[tuple[str, StoredChunk, PathKey | None]]] = {}
        for t in self.tensors:
            for c in t.chunks:
                by_file.setdefault(c.file, []).append((_dotted(t.path), c, None))
        for path, c in self.other_records:
            by_file.setdefault(c.file, []).append((_dotted(path), c, path))
        return by_file

    def file_problems(self) -> list[str]:
        """Shard files that are missing or shorter than the metadata says, each named.

        Raises :class:`~lerobot_ckpt.paths.UnsafePathError` for a name that exists but is not a
        regular file inside the directory (a symlink to another checkpoint's shard, a directory, a
        FIFO): that is refused, not reported as missing."""
        problems = []
        for name, records in sorted(self.records_by_file().items()):
            needed = max(c.start + c.length for _, c, _ in records)
            try:
                path = resolve_inside(
                    self.directory, name, named_by=self.metadata_path, entry=_path_entry(records[0][0])
                )
            except UnsafePathError:
                if os.path.lexists(self.directory / name):
                    raise
                problems.append(f"{name} is missing")
                continue
            if (size := os.lstat(path).st_size) < needed:
                problems.append(f"{name} is truncated ({size} bytes, the metadata needs ≥ {needed})")
        return problems

    def check_files(self) -> None:
        problems = self.file_problems()
        if problems:
            raise MissingCheckpointFileError(
                self.directory, f"{len(problems)} shard file(s) missing or truncated: {'; '.join(problems)}"
            )

    def record_problems(self) -> list[tuple[str, str]]:
        """``(shard file, what)`` for each file holding a record that is not framed as a ``torch.save``
        zip: a file overwritten or damaged in place after the save, with its size intact.

        Two 4-byte reads per record (its first local header and its end-of-central-directory
        signature), no decoding: cheap enough to run before a resume changes anything. Damage inside
        a record's payload is not seen here (DCP stores no checksums); torch reports it while reading.
        Run :meth:`check_files` first: the ranges read here must exist.
        """
        problems = []
        for name, records in sorted(self.records_by_file().items()):
            with self.open_shard(name, records[0][0]) as f:
                for where, c, _ in sorted(records, key=lambda item: item[1].start):
                    if (
                        c.length < _RECORD_MIN
                        or _read_at(f, c.start) != _ZIP_HEAD
                        or _read_at(f, c.start + c.length - _ZIP_END_SIZE) != _ZIP_END
                    ):
                        problems.append((name, f"the record of {where} at byte {c.start}"))
                        break  # one per file: a damaged file is usually damaged throughout
        return problems

    def check_records(self) -> None:
        """Raise :class:`CorruptCheckpointError` naming the first damaged shard file (see
        :meth:`record_problems`); what would be valid is the file as the save wrote it."""
        problems = self.record_problems()
        if problems:
            name, what = problems[0]
            others = f"; {len(problems) - 1} more shard file(s) are damaged too" if len(problems) > 1 else ""
            raise CorruptCheckpointError(
                self.directory / name,
                f"{what} is not a torch.save record, so the file was overwritten or damaged after the save"
                f"{others}; restore the directory from an intact copy of the checkpoint "
                "or resume from another one",
            )


def _one_line(exc: BaseException) -> str:
    """torch's decoding error in one line: the weights-only unpickler's own verdict when there is one
    (the message around it advises loading the file with ``weights_only=False``, which would run
    whatever the record names), else the first line."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        detail = next((line.strip() for line in text.split(marker, 1)[1].splitlines() if line.strip()), "")
        return f"the weights-only unpickler refused it ({detail[:160]})"
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(exc).__name__]
    return lines[0][:200]


class _Window(io.RawIOBase):
    """A read-only view of ``[start, start + length)`` of an open file, so ``torch.load`` reads one
    record straight into the tensor's storage (``readinto``) instead of through a bytes copy."""

    def __init__(self, raw: io.RawIOBase, start: int, length: int) -> None:
        super().__init__()
        self._raw, self._start, self._length, self._pos = raw, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._length - self._pos)
        if n <= 0:
            return 0
        self._raw.seek(self._start + self._pos)
        got = self._raw.readinto(memoryview(buffer)[:n]) or 0
        self._pos += got
        return got


class ChunkReader:
    """Reads chunks of one DCP directory, keeping at most one shard file open at a time."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._name: str | None = None
        self._raw: io.RawIOBase | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw, self._name = None, None

    def raw(self, chunk: StoredChunk) -> io.RawIOBase:
        """The open shard file holding ``chunk`` (the previous one is closed), opened under the rule
        for names read from files (see :meth:`DcpIndex.open_shard`)."""
        if self._name != chunk.file:
            self.close()
            self._raw = open_inside(  # kept open across calls
                self.directory,
                chunk.file,
                named_by=self.directory / METADATA_FILE,
                entry="a relative_path",
                buffering=0,
            )
            self._name = chunk.file
        return self._raw

    def read(self, chunk: StoredChunk, where: str) -> torch.Tensor:
        """The chunk decoded by ``torch.load`` (imports torch)."""
        torch = require_torch(
            f"decoding {where} in {self.directory / chunk.file} (a record stored in a form only torch reads)"
        )

        self.raw(chunk)
        try:
            tensor = torch.load(
                _Window(self._raw, chunk.start, chunk.length), map_location="cpu", weights_only=True
            )
        except Exception as exc:  # noqa: BLE001 - any decoding failure is a corrupt shard
            raise CorruptCheckpointError(
                self.directory / chunk.file, f"cannot decode {where} at byte {chunk.start}: {_one_line(exc)}"
            ) from None
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != chunk.sizes:
            got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise CorruptCheckpointError(
                self.directory / chunk.file,
                f"{where}: stored chunk is {got}, the metadata says {chunk.sizes}",
            )
        if chunk.dtype is not None and tensor.dtype != chunk.dtype.torch:  # else silently cast on writing
            raise CorruptCheckpointError(
                self.directory / chunk.file,
                f"{where}: stored chunk is {str(tensor.dtype).removeprefix('torch.')}, "
                f"the metadata says {chunk.dtype.name}",
            )
        return tensor


def row_slabs(tensor: StoredTensor, where: str, directory: Path) -> list[StoredChunk] | None:
    """The chunks in row order when they are dim-0 slabs tiling the tensor (FSDP's ``Shard(0)``
    pieces), None when some chunk splits another dim; gaps or overlaps are corruption."""
    if not all(c.is_row_slab(tensor.shape) for c in tensor.chunks):
        return None
    ordered = sorted(tensor.chunks, key=lambda c: c.offsets[:1])
    if not tensor.shape:
        return ordered[:1]
    covered = 0
    for chunk in ordered:
        if chunk.offsets[0] != covered:
            raise CorruptCheckpointError(
                directory / METADATA_FILE,
                f"{where}: chunks leave rows {covered}..{chunk.offsets[0]} uncovered",
            )
        covered += chunk.sizes[0]
    if covered != tensor.shape[0]:
        raise CorruptCheckpointError(
            directory / METADATA_FILE, f"{where}: chunks cover {covered} of {tensor.shape[0]} rows"
        )
    return ordered


def iter_full_tensor_pieces(
    reader: ChunkReader, tensor: StoredTensor, where: str
) -> Iterator[tuple[int, torch.Tensor]]:
    """``(first_row, slab)`` pieces covering ``tensor`` in row order, one chunk in memory at a time.

    Chunks that are not dim-0 slabs (a tensor split along another dim) are assembled into the full
    tensor first, the one case where a whole tensor is held.
    """
    slabs = row_slabs(tensor, where, reader.directory)
    if slabs is not None:
        for chunk in slabs:
            yield (chunk.offsets[0] if chunk.offsets else 0), reader.read(chunk, where)
        return
    torch = require_torch(f"assembling {where} (split along a dimension other than the first)")
    full = torch.empty(tensor.shape, dtype=tensor.dtype.torch)
    for chunk in tensor.chunks:
        index = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True))
        full[index] = reader.read(chunk, where)
    yield 0, full


def shard_files(directory: Path) -> list[str]:
    return sorted(p for p in os.listdir(directory) if p.endswith(".distcp"))


def read_full_tensor(reader: ChunkReader, tensor: StoredTensor, where: str) -> torch.Tensor:
    """One whole tensor (for small states only: PEFT adapters handed to the caller's loader)."""
    import torch

    pieces = list(iter_full_tensor_pieces(reader, tensor, where))
    if len(pieces) == 1 and tuple(pieces[0][1].shape) == tensor.shape:
        return pieces[0][1]
    return torch.cat([p for _, p in pieces], dim=0)
