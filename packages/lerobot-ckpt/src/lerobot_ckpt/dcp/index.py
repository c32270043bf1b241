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


@define(frozen=True)
class StoredChunk:
    """One saved piece of a tensor: its place in the global tensor and its bytes on disk."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    start: int
    length: int

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
        planner = metadata.planner_data or {}
        storage = {
            (index.fqn, None if index.offset is None else tuple(index.offset)): info
            for index, info in (metadata.storage_data or {}).items()
        }
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
            for chunk in entry.chunks:
                info = storage.get((key, tuple(chunk.offsets)))
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
                        tuple(int(o) for o in chunk.offsets),
                        tuple(int(d) for d in chunk.sizes),
                        str(info.relative_path),
                        int(info.offset),
                        int(info.length),
                    )
                )
            try:
                dtype = dtype_of(entry.properties.dtype)
            except TypeError as exc:
                raise CorruptCheckpointError(directory / METADATA_FILE, f"{key}: {exc}") from None
            tensors.append(StoredTensor(path, dtype, tuple(int(d) for d in entry.size), tuple(chunks)))
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

    def file_problems(self) -> list[str]:
        """Shard files that are missing or shorter than the metadata says, each named."""
        needed: dict[str, int] = {}
        for t in self.tensors:
            for c in t.chunks:
                needed[c.file] = max(needed.get(c.file, 0), c.start + c.length)
        problems = []
        for name in sorted(needed):
            path = self.directory / name
            if not path.is_file():
                problems.append(f"{name} is missing")
            elif (size := path.stat().st_size) < needed[name]:
                problems.append(f"{name} is truncated ({size} bytes, the metadata needs ≥ {needed[name]})")
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
        by_file: dict[str, list[tuple[str, StoredChunk]]] = {}
        for t in self.tensors:
            for c in t.chunks:
                by_file.setdefault(c.file, []).append((_dotted(t.path), c))
        for path, c in self.other_records:
            by_file.setdefault(c.file, []).append((_dotted(path), c))
        problems = []
        for name in sorted(by_file):
            with open(self.directory / name, "rb") as f:
                for where, c in sorted(by_file[name], key=lambda item: item[1].start):
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
        """The open shard file holding ``chunk`` (the previous one is closed)."""
        if self._name != chunk.file:
            self.close()
            self._raw = open(self.directory / chunk.file, "rb", buffering=0)  # noqa: SIM115 - kept open across calls
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
                self.directory / chunk.file, f"cannot decode {where} at byte {chunk.start}: {exc}"
            ) from None
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != chunk.sizes:
            got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise CorruptCheckpointError(
                self.directory / chunk.file,
                f"{where}: stored chunk is {got}, the metadata says {chunk.sizes}",
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
