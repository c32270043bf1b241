"""Offline merge of ``pytorch_model_fsdp_0/`` into ``model.safetensors``: one process, no GPU, no process group.

accelerate's ``merge_fsdp_weights`` (``dcp_to_torch_save`` underneath) loads the whole state dict
and then serialises it, so it needs about twice the model in RAM. Here the output file is laid out
from the DCP metadata alone (shapes and dtypes give every byte offset), then filled one stored
chunk at a time: each chunk's raw bytes are located in its shard file (:mod:`lerobot_ckpt.dcp_raw`)
and copied in the kernel, so the conversion itself holds almost no memory; with ``--dtype`` a
chunk goes through two reused buffers (the largest chunk and its cast), and a record only
``torch.load`` can read costs one chunk. Whatever the model size, that is the peak.

The file is written under a temporary name, fsynced and renamed, so an interrupted conversion
never leaves a half-written ``model.safetensors``. ``delete_dcp`` re-reads the output and compares
it with the shards, updates ``training_step.json`` (so loaders take the new file), and only then
removes the shard directory. A PEFT checkpoint (``adapter_config.json`` present) becomes
``adapter_model.safetensors``: its shards hold only the adapter, already under PEFT's key names.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from attrs import define, field
from safetensors import safe_open

from lerobot_ckpt import dcp_raw
from lerobot_ckpt.dcp_index import ChunkReader, DcpIndex, StoredTensor, iter_full_tensor_pieces, row_slabs
from lerobot_ckpt.dcp_io import MODEL_KEY
from lerobot_ckpt.errors import (
    CheckpointError,
    CorruptCheckpointError,
    InsufficientDiskSpaceError,
    MissingCheckpointFileError,
    OutputExistsError,
)
from lerobot_ckpt.fsio import fsync_dir, remove_quietly
from lerobot_ckpt.layout import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    MODEL_DCP_DIR,
    MODEL_WEIGHTS,
    PRETRAINED_MODEL_DIR,
    TRAINING_STATE_DIR,
    CheckpointPaths,
)
from lerobot_ckpt.record import update_artifacts
from lerobot_ckpt.stwriter import ReusableBuffer, SafetensorsPlan, SafetensorsStreamWriter, pread_into
from lerobot_ckpt.tensorfile import FORMAT_METADATA

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DISK_RESERVE = 64 * 2**20  # left free besides the output: the file system needs room for metadata


@define(frozen=True)
class Progress:
    """Reported after each tensor: enough for a "tensors i/n, bytes" progress display."""

    tensors_done: int
    tensors_total: int
    bytes_done: int
    bytes_total: int
    name: str


@define(frozen=True)
class ConvertResult:
    output: Path
    tensors: int
    bytes: int
    seconds: float
    verified: bool
    deleted_dcp: bool
    record_updated: bool


@define(frozen=True)
class Located:
    """The directories one ``--checkpoint_dir`` names."""

    pretrained: Path
    step_dir: Path | None = field(default=None)

    @property
    def dcp(self) -> Path:
        return self.pretrained / MODEL_DCP_DIR

    @property
    def is_peft(self) -> bool:
        return (self.pretrained / ADAPTER_CONFIG).is_file()

    @property
    def output(self) -> Path:
        return self.pretrained / (ADAPTER_WEIGHTS if self.is_peft else MODEL_WEIGHTS)


def locate(checkpoint_dir: Path | str) -> Located:
    """Accepts a step directory (or ``checkpoints/last``), its ``pretrained_model/`` or a file in it,
    or the shard directory itself."""
    given = Path(checkpoint_dir).expanduser()
    if not given.exists():
        raise MissingCheckpointFileError(given, "no such directory")
    path = given.resolve()
    if path.is_file():
        path = path.parent
    if path.name == MODEL_DCP_DIR:
        path = path.parent
    pretrained = path / PRETRAINED_MODEL_DIR if (path / PRETRAINED_MODEL_DIR).is_dir() else path
    if not pretrained.is_dir():
        raise MissingCheckpointFileError(given, "not a directory: pass a checkpoint step directory or its "
                                         f"{PRETRAINED_MODEL_DIR}/")
    step = pretrained.parent if (pretrained.parent / TRAINING_STATE_DIR).is_dir() else None
    return Located(pretrained, step)


def _no_dcp_message(where: Located) -> str:
    has = " It already has model.safetensors." if (where.pretrained / MODEL_WEIGHTS).is_file() else ""
    return (f"no DCP weight shards here: only sharded (FSDP/HSDP) runs saved with --checkpoint_format=dcp or "
            f"--checkpoint_format=safetensors_dcp write {MODEL_DCP_DIR}/ (the default safetensors format writes "
            f"model.safetensors directly).{has}")


def model_tensors(index: DcpIndex) -> dict[str, StoredTensor]:
    """The weights: under ``model`` (ours, accelerate's), else the one top-level key, else everything."""
    nested = index.under(MODEL_KEY)
    if nested:
        return nested
    prefixes = index.prefixes()
    if len(prefixes) == 1:
        return index.under(next(iter(prefixes)))
    return {".".join(map(str, t.path)): t for t in index.tensors}


def _out_dtype(stored: torch.dtype, wanted: torch.dtype | None) -> torch.dtype:
    return wanted if wanted is not None and stored.is_floating_point else stored


def _check_disk(directory: Path, needed: int, output: Path) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed + DISK_RESERVE:
        raise InsufficientDiskSpaceError(
            f"not enough free disk space for {output}: it needs {_human(needed)} (+{_human(DISK_RESERVE)} reserve), "
            f"{directory} has {_human(free)} free"
        )


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"


def _largest(tensors: dict[str, StoredTensor], plan: SafetensorsPlan) -> int:
    """Buffer capacity: the largest tensor in its wider dtype (stored or cast). Pages of a buffer are
    only resident once written, so sizing for a whole tensor costs one chunk when chunks are smaller."""
    return max((t.nbytes // t.dtype.itemsize * max(t.dtype.itemsize, plan[name].dtype.itemsize)
                for name, t in tensors.items()), default=0)


def _write(path: Path, tensors: dict[str, StoredTensor], plan: SafetensorsPlan, reader: ChunkReader,
           progress: Callable[[Progress], None] | None) -> None:
    """Fill the planned file chunk by chunk: a kernel copy when the bytes can go as they are, a cast
    through two reused buffers for ``--dtype``, ``torch.load`` for records of another shape."""
    writer = SafetensorsStreamWriter(path, plan)
    largest = _largest(tensors, plan)
    source, cast = ReusableBuffer(largest), ReusableBuffer(largest)
    done = 0
    try:
        for i, slot in enumerate(plan.slots, 1):
            stored = tensors[slot.name]
            slabs = row_slabs(stored, slot.name, reader.directory)
            for chunk in slabs or ():
                row = chunk.offsets[0] if chunk.offsets else 0
                raw = dcp_raw.locate(reader.raw(chunk), chunk, stored.dtype)
                if raw is not None and slot.dtype == stored.dtype:
                    done += writer.copy_range(slot.name, reader.raw(chunk).fileno(), raw.offset, raw.nbytes, row=row)
                elif raw is not None:
                    src = source.view("cpu", raw.dtype, raw.shape)
                    pread_into(reader.raw(chunk).fileno(), src, raw.offset)
                    done += writer.write(slot.name, cast.view("cpu", slot.dtype, raw.shape).copy_(src), row=row)
                else:
                    done += writer.write(slot.name, reader.read(chunk, slot.name).to(slot.dtype), row=row)
            if slabs is None:
                for row, piece in iter_full_tensor_pieces(reader, stored, slot.name):
                    done += writer.write(slot.name, piece.to(slot.dtype), row=row)
            if progress is not None:
                progress(Progress(i, len(plan.slots), done, plan.total_size - plan.data_start, slot.name))
    except BaseException:
        writer.abort()
        raise
    writer.close()


def _verify(path: Path, tensors: dict[str, StoredTensor], plan: SafetensorsPlan, reader: ChunkReader) -> None:
    """Every byte of the written file equals the shards (cast as requested), one chunk at a time,
    read back through reused buffers; the header is checked by safetensors itself."""
    with safe_open(str(path), framework="pt", device="cpu") as f:
        if set(f.keys()) != set(tensors):
            raise CorruptCheckpointError(path, "the written file does not list the tensors of the shards")
    largest = _largest(tensors, plan)
    source, cast, written = ReusableBuffer(largest), ReusableBuffer(largest), ReusableBuffer(largest)
    fd = os.open(path, os.O_RDONLY)
    try:
        for slot in plan.slots:
            stored = tensors[slot.name]
            for row, piece in _pieces(reader, stored, slot.name, source):
                expected = cast.view("cpu", slot.dtype, tuple(piece.shape)).copy_(piece)
                got = written.view("cpu", slot.dtype, tuple(piece.shape))
                pread_into(fd, got, plan.data_start + slot.begin + row * slot.row_bytes)
                if not torch.equal(got.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)):
                    raise CorruptCheckpointError(path, f"{slot.name} differs from the shards after writing")
    finally:
        os.close(fd)


def _pieces(reader: ChunkReader, stored: StoredTensor, where: str, buffer: ReusableBuffer):
    """``(row, slab)`` of a stored tensor, raw bytes read into ``buffer`` where possible."""
    slabs = row_slabs(stored, where, reader.directory)
    if slabs is None:
        yield from iter_full_tensor_pieces(reader, stored, where)
        return
    for chunk in slabs:
        row = chunk.offsets[0] if chunk.offsets else 0
        raw = dcp_raw.locate(reader.raw(chunk), chunk, stored.dtype)
        if raw is None:
            yield row, reader.read(chunk, where)
        else:
            piece = buffer.view("cpu", raw.dtype, raw.shape)
            pread_into(reader.raw(chunk).fileno(), piece, raw.offset)
            yield row, piece


def _record(where: Located, *, deleting: bool) -> bool:
    """Let loaders know the new file exists (and, when deleting, that the shards do not)."""
    if where.step_dir is None:
        return False
    paths = CheckpointPaths(where.step_dir)
    if not paths.training_step.is_file():
        return False
    changes = {"model_dcp": False} if deleting else {}
    if not where.is_peft:
        changes["model_safetensors"] = True
    if not changes:
        return False
    try:
        update_artifacts(paths, **changes)
    except CheckpointError:  # a record we cannot read (e.g. LeRobot ≤ 0.6.x): the weights file is still valid
        if deleting:
            raise
        return False
    return True


def convert_dcp(checkpoint_dir: Path | str, *, dtype: torch.dtype | str | None = None, delete_dcp: bool = False,
                overwrite: bool = False, verify: bool | None = None,
                progress: Callable[[Progress], None] | None = None) -> ConvertResult:
    """Merge the DCP weight shards of a checkpoint into one safetensors file next to them.

    ``dtype`` casts floating tensors (``"bfloat16"``, ``"float16"``, ``"float32"``; default: as
    stored). ``verify`` defaults to ``delete_dcp``. Raises :class:`CheckpointError` subclasses
    for everything a user can fix (missing or truncated shards, an existing output, a full disk).
    """
    t0 = time.monotonic()
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        dtype = DTYPES[dtype]
    verify = delete_dcp if verify is None else verify
    where = locate(checkpoint_dir)
    if not where.dcp.is_dir():
        raise MissingCheckpointFileError(where.dcp, _no_dcp_message(where))
    index = DcpIndex.read(where.dcp)
    index.check_files()
    tensors = model_tensors(index)
    if not tensors:
        raise CorruptCheckpointError(where.dcp, "the shards hold no tensors")
    output = where.output
    if output.exists() and not overwrite:
        raise OutputExistsError(f"{output} already exists; pass --overwrite to replace it")
    plan = SafetensorsPlan.build(((name, _out_dtype(t.dtype, dtype), t.shape) for name, t in tensors.items()),
                                 FORMAT_METADATA)
    _check_disk(where.pretrained, plan.total_size, output)

    tmp = where.pretrained / f".{output.name}.tmp-{os.getpid()}"
    try:
        with ChunkReader(where.dcp) as reader:
            _write(tmp, tensors, plan, reader, progress)
            if verify:
                _verify(tmp, tensors, plan, reader)
        os.replace(tmp, output)
        fsync_dir(where.pretrained)
    finally:
        if tmp.exists():
            remove_quietly(tmp)
    record_updated = _record(where, deleting=delete_dcp)
    if delete_dcp:
        doomed = where.pretrained / f".{MODEL_DCP_DIR}.deleting-{os.getpid()}"
        os.rename(where.dcp, doomed)  # one atomic step: never a half-deleted directory under the real name
        fsync_dir(where.pretrained)
        shutil.rmtree(doomed)
    return ConvertResult(output=output, tensors=len(plan.slots), bytes=plan.total_size,
                         seconds=time.monotonic() - t0, verified=verify, deleted_dcp=delete_dcp,
                         record_updated=record_updated)
