"""Offline merge of ``pytorch_model_fsdp_0/`` into ``model.safetensors``: one process, no GPU, no process
group.

accelerate's ``merge_fsdp_weights`` (``dcp_to_torch_save`` underneath) loads the whole state dict
and then serialises it, so it needs about twice the model in RAM. Here the output file is laid out
from the DCP metadata alone (shapes and dtypes give every byte offset), then filled one stored
chunk at a time: each chunk's raw bytes are located in its shard file (:mod:`lerobot_ckpt.dcp.raw`)
and copied in the kernel, so the conversion itself holds almost no memory; with ``--dtype`` a
chunk goes through two reused buffers (the largest chunk and its cast), and a record only
``torch.load`` can read costs one chunk. Whatever the model size, that is the peak.

That default path (no ``--dtype``) imports no torch at all: the metadata is read by a restricted
unpickler (:mod:`lerobot_ckpt.dcp.metadata`), dtypes are plain values (:mod:`lerobot_ckpt._dtypes`),
and ``--delete_dcp``'s verification compares bytes. Importing a CUDA build of torch alone is
~0.6 GB resident, more than the whole merge; torch is imported only where it computes: a
``--dtype`` cast (torch's own rounding, so the output equals ``tensor.to(dtype)`` bitwise), a
record only ``torch.load`` can decode, and a tensor whose chunks split a dim other than the first.

The file is written under a temporary name, fsynced and renamed, so an interrupted conversion
never leaves a half-written ``model.safetensors``. The checkpoint may be someone else's, so no
write goes through a name it could have planted: the temporary file is made by ``mkstemp`` (a fresh
random name, ``O_EXCL | O_NOFOLLOW``), and a destination (the output, ``training_step.json``, the
directories holding them, a shard directory to delete) that is a symlink or a directory is refused
in one line before anything is written. ``delete_dcp`` re-reads the output and compares
it with the shards, updates ``training_step.json`` (so loaders take the new file), and only then
removes the shard directory. A PEFT checkpoint (``adapter_config.json`` present) becomes
``adapter_model.safetensors``: its shards hold only the adapter, already under PEFT's key names.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs
from attrs import define, field

from lerobot_ckpt._dtypes import DType, dtype_of
from lerobot_ckpt.commit.filesystem import fsync_dir, staged_sibling
from lerobot_ckpt.convert.cast import cast_bytes
from lerobot_ckpt.dcp import raw as dcp_raw
from lerobot_ckpt.dcp.index import (
    MODEL_KEY,
    ChunkReader,
    DcpIndex,
    StoredChunk,
    StoredTensor,
    iter_full_tensor_pieces,
    row_slabs,
)
from lerobot_ckpt.dcp.untrusted import check_untrusted
from lerobot_ckpt.discovery import _check_last_on_the_way, through_last
from lerobot_ckpt.errors import (
    CheckpointError,
    CheckpointWriteError,
    CorruptCheckpointError,
    InsufficientDiskSpaceError,
    MissingCheckpointFileError,
    OutputExistsError,
)
from lerobot_ckpt.layout import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    EMA_PRETRAINED_MODEL_DIR,
    MODEL_DCP_DIR,
    MODEL_WEIGHTS,
    PRETRAINED_MODEL_DIR,
    TRAINING_STATE_DIR,
    CheckpointPaths,
    parse_step_dir_name,
)
from lerobot_ckpt.paths import LinkedLayoutError, layout_path, refuse_link
from lerobot_ckpt.safetensors.stream import (
    FORMAT_METADATA,
    RESERVED_NAME,
    ByteBuffer,
    SafetensorsPlan,
    SafetensorsStreamWriter,
    TensorSlot,
    pread_into,
    raw_bytes,
)
from lerobot_ckpt.state.record import update_artifacts

DTYPES = {name: dtype_of(name) for name in ("bfloat16", "float16", "float32")}
DISK_RESERVE = 64 * 2**20  # left free besides the output: the file system needs room for metadata
COMPARE_BLOCK = 8 * 2**20  # verification reads shard and output in blocks of this size


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
    # A step directory's pretrained_model_ema/ with DCP shards is converted in the same call, the same way.
    ema: ConvertResult | None = None


@define(frozen=True)
class Located:
    """The directories one ``--checkpoint_dir`` names."""

    pretrained: Path
    step_dir: Path | None = field(default=None)

    @property
    def dcp(self) -> Path:
        return self.pretrained / MODEL_DCP_DIR

    @property
    def is_ema(self) -> bool:
        return self.pretrained.name == EMA_PRETRAINED_MODEL_DIR

    @property
    def ema_sibling(self) -> Located | None:
        """The step's ``pretrained_model_ema/`` when this is its ``pretrained_model/`` and it has shards."""
        if self.step_dir is None or self.is_ema:
            return None
        ema = self.step_dir / EMA_PRETRAINED_MODEL_DIR
        return Located(ema, self.step_dir) if (ema / MODEL_DCP_DIR).is_dir() else None

    @property
    def is_peft(self) -> bool:
        return (self.pretrained / ADAPTER_CONFIG).is_file()

    @property
    def output(self) -> Path:
        return self.pretrained / (ADAPTER_WEIGHTS if self.is_peft else MODEL_WEIGHTS)


def locate(checkpoint_dir: Path | str) -> Located:
    """Accepts a step directory (or ``checkpoints/last``), its ``pretrained_model/`` or a file in it,
    or the shard directory itself.

    Nothing of the checkpoint's own layout is resolved: a symlinked step directory,
    ``pretrained_model/``, shard directory or file could lead into another run, which would then be
    written into (and, with ``--delete_dcp``, deleted from), so each is refused in one line. The one
    link followed is a ``checkpoints/last`` that points at a step directory beside it. Above the
    layout (the run directory, ``checkpoints/``) the path is the user's, symlinks included."""
    given = Path(checkpoint_dir).expanduser()
    if not given.exists():
        raise MissingCheckpointFileError(given, "no such directory")
    _check_last_on_the_way(given)  # `last` leading outside checkpoints/ would be written into there
    path = through_last(given)
    what = "a part of a checkpoint's layout"
    if path.is_file():
        if path.is_symlink():
            raise LinkedLayoutError(path, what)
        path = path.parent
    elif path.is_symlink() and not _is_layout_name(path):
        path = path.resolve()  # the user's own alias of a checkpoint directory
    if path.name == MODEL_DCP_DIR:
        if path.is_symlink():
            raise LinkedLayoutError(path, what)
        path = path.parent
    if path.is_symlink() and _is_layout_name(path):
        raise LinkedLayoutError(path, what)
    inner = layout_path(path, PRETRAINED_MODEL_DIR, what=what)
    pretrained = inner if inner.is_dir() else path
    if not pretrained.is_dir():
        raise MissingCheckpointFileError(
            given, f"not a directory: pass a checkpoint step directory or its {PRETRAINED_MODEL_DIR}/"
        )
    step = pretrained.parent if (pretrained.parent / TRAINING_STATE_DIR).is_dir() else None
    if step is not None:
        if step.is_symlink():
            raise LinkedLayoutError(step, what)
        layout_path(step, TRAINING_STATE_DIR, what=what)
        layout_path(step, EMA_PRETRAINED_MODEL_DIR, what=what)
    layout_path(pretrained, MODEL_DCP_DIR, what=what)
    return Located(pretrained, step)


def _is_layout_name(path: Path) -> bool:
    """A name only a checkpoint's layout uses (a step directory, ``pretrained_model/``, …): a symlink
    by that name is part of the checkpoint, not a user's alias of it."""
    return parse_step_dir_name(path.name) is not None or path.name in (
        PRETRAINED_MODEL_DIR,
        EMA_PRETRAINED_MODEL_DIR,
        TRAINING_STATE_DIR,
        MODEL_DCP_DIR,
    )


def _no_dcp_message(where: Located) -> str:
    has = " It already has model.safetensors." if (where.pretrained / MODEL_WEIGHTS).is_file() else ""
    return (
        f"no DCP weight shards here: only sharded (FSDP/HSDP) runs saved with --checkpoint_format=dcp or "
        f"--checkpoint_format=safetensors_dcp write {MODEL_DCP_DIR}/ (the default safetensors format writes "
        f"model.safetensors directly).{has}"
    )


def model_tensors(index: DcpIndex) -> dict[str, StoredTensor]:
    """The weights: under ``model`` (ours, accelerate's), else the one top-level key, else everything."""
    nested = index.under(MODEL_KEY)
    if nested:
        return nested
    prefixes = index.prefixes()
    if len(prefixes) == 1:
        return index.under(next(iter(prefixes)))
    return {".".join(map(str, t.path)): t for t in index.tensors}


def _out_dtype(stored: DType, wanted: DType | None) -> DType:
    return wanted if wanted is not None and stored.is_floating_point else stored


def _check_disk(directory: Path, needed: int, output: Path) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed + DISK_RESERVE:
        raise InsufficientDiskSpaceError(
            f"not enough free disk space for {output}: it needs {_human(needed)} (+{_human(DISK_RESERVE)} "
            f"reserve), {directory} has {_human(free)} free"
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
    return max(
        (
            t.nbytes // t.dtype.itemsize * max(t.dtype.itemsize, plan[name].dtype.itemsize)
            for name, t in tensors.items()
        ),
        default=0,
    )


def _write(
    path: Path,
    fd: int,
    tensors: dict[str, StoredTensor],
    plan: SafetensorsPlan,
    reader: ChunkReader,
    progress: Callable[[Progress], None] | None,
) -> None:
    """Fill the planned file (``fd``, new and ours, at ``path``) chunk by chunk: a kernel copy when the
    bytes can go as they are, a cast of the bytes through two reused buffers for ``--dtype`` (neither
    needs torch), ``torch.load`` only for records of another shape (which a torch-free install refuses
    in one line)."""
    writer = SafetensorsStreamWriter(path, plan, fd=fd)
    largest = _largest(tensors, plan)
    source = ByteBuffer(largest)  # allocated on first use
    done = 0
    try:
        for i, slot in enumerate(plan.slots, 1):
            stored = tensors[slot.name]
            slabs = row_slabs(stored, slot.name, reader.directory)
            for chunk in slabs or ():
                row = chunk.offsets[0] if chunk.offsets else 0
                raw = dcp_raw.locate(reader.raw(chunk), chunk, stored.dtype)
                if raw is not None and slot.dtype == stored.dtype:
                    done += writer.copy_range(
                        slot.name, reader.raw(chunk).fileno(), raw.offset, raw.nbytes, row=row
                    )
                elif raw is not None:
                    src = source.view(raw.nbytes)
                    pread_into(reader.raw(chunk).fileno(), src, raw.offset)
                    done += writer.write_bytes(
                        slot.name, cast_bytes(src, raw.dtype, slot.dtype), raw.shape, row=row
                    )
                else:
                    done += writer.write(
                        slot.name, reader.read(chunk, slot.name).to(slot.dtype.torch), row=row
                    )
            if slabs is None:
                for row, piece in iter_full_tensor_pieces(reader, stored, slot.name):
                    done += writer.write(slot.name, piece.to(slot.dtype.torch), row=row)
            if progress is not None:
                progress(Progress(i, len(plan.slots), done, plan.total_size - plan.data_start, slot.name))
    except BaseException:
        writer.abort()
        raise
    writer.close()


def _same_bytes(fd_a: int, at_a: int, fd_b: int, at_b: int, nbytes: int) -> bool:
    """Two byte ranges are equal, compared a block at a time (no torch, about two blocks of memory)."""
    done = 0
    while done < nbytes:
        n = min(COMPARE_BLOCK, nbytes - done)
        if os.pread(fd_a, n, at_a + done) != os.pread(fd_b, n, at_b + done):
            return False
        done += n
    return True


class _Comparer:
    """Compares the shards' bytes (cast as requested) with the written bytes, in reused buffers."""

    def __init__(self, fd: int, capacity: int) -> None:
        self.fd = fd
        self.source, self.written = ByteBuffer(capacity), ByteBuffer(capacity)

    def data(self, expected: memoryview, at: int) -> bool:
        got = self.written.view(len(expected))
        pread_into(self.fd, got, at)
        return got == expected

    def tensor(self, piece, dtype: DType, at: int) -> bool:
        """A tensor decoded by torch (records only torch reads)."""
        return self.data(raw_bytes(piece.to(dtype.torch)), at)

    def chunk(
        self, reader: ChunkReader, chunk: StoredChunk, stored: StoredTensor, slot: TensorSlot, at: int
    ) -> bool:
        raw = dcp_raw.locate(reader.raw(chunk), chunk, stored.dtype)
        if raw is not None and slot.dtype == stored.dtype:
            return _same_bytes(reader.raw(chunk).fileno(), raw.offset, self.fd, at, raw.nbytes)
        if raw is None:
            return self.tensor(reader.read(chunk, slot.name), slot.dtype, at)
        src = self.source.view(raw.nbytes)
        pread_into(reader.raw(chunk).fileno(), src, raw.offset)
        return self.data(cast_bytes(src, raw.dtype, slot.dtype), at)


def _verify(path: Path, tensors: dict[str, StoredTensor], plan: SafetensorsPlan, reader: ChunkReader) -> None:
    """Every byte of the written file equals the plan's header and the shards' bytes (cast as
    requested), one chunk at a time: byte ranges compared directly where the bytes were copied,
    tensors through reused buffers where they were cast or decoded."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if os.pread(fd, len(plan.header), 0) != plan.header:
            raise CorruptCheckpointError(path, "the written file's header differs from the one planned")
        compare = _Comparer(fd, _largest(tensors, plan))
        for slot in plan.slots:
            stored = tensors[slot.name]
            slabs = row_slabs(stored, slot.name, reader.directory)
            if slabs is None:
                same = all(
                    compare.tensor(piece, slot.dtype, plan.data_start + slot.begin + row * slot.row_bytes)
                    for row, piece in iter_full_tensor_pieces(reader, stored, slot.name)
                )
            else:
                same = all(
                    compare.chunk(
                        reader,
                        chunk,
                        stored,
                        slot,
                        plan.data_start
                        + slot.begin
                        + (chunk.offsets[0] if chunk.offsets else 0) * slot.row_bytes,
                    )
                    for chunk in slabs
                )
            if not same:
                raise CorruptCheckpointError(path, f"{slot.name} differs from the shards after writing")
    finally:
        os.close(fd)


def _record(where: Located, *, deleting: bool) -> bool:
    """Let loaders know the new file exists (and, when deleting, that the shards do not)."""
    if where.step_dir is None:
        return False
    paths = CheckpointPaths(where.step_dir)
    if not paths.training_step.is_file():
        return False
    if where.is_ema:  # the EMA flags cover the adapter file too
        changes = {"ema_dcp": False, "ema_safetensors": True} if deleting else {"ema_safetensors": True}
    else:
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


def convert_dcp(
    checkpoint_dir: Path | str,
    *,
    dtype: DType | str | None = None,
    delete_dcp: bool = False,
    overwrite: bool = False,
    verify: bool | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> ConvertResult:
    """Merge the DCP weight shards of a checkpoint into one safetensors file next to them.

    Given a step directory (or its ``pretrained_model/``), a ``pretrained_model_ema/`` beside it
    with shards is converted too, with the same options (``ConvertResult.ema``); its own directory
    converts it alone.

    ``dtype`` casts floating tensors (``"bfloat16"``, ``"float16"``, ``"float32"``, or the
    ``torch.dtype``; default: as stored, and then torch is never imported). ``verify`` defaults to
    ``delete_dcp``. Raises :class:`CheckpointError` subclasses for everything a user can fix (missing or
    truncated shards, an existing output, a full disk).
    """
    if dtype is not None:
        name = str(dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        dtype = DTYPES[name]
    verify = delete_dcp if verify is None else verify
    where = locate(checkpoint_dir)
    ema = where.ema_sibling
    if ema is not None and where.dcp.is_dir():  # both checked before either is written
        _check_destinations(ema, delete_dcp)
        _check_destinations(where, delete_dcp)
        ema_tensors, tensors = _checked_tensors(ema), _checked_tensors(where)
        _check_output(ema, overwrite)
        _check_output(where, overwrite)
        ema_result = _convert(ema, ema_tensors, dtype, delete_dcp, overwrite, verify, progress)
        return attrs.evolve(
            _convert(where, tensors, dtype, delete_dcp, overwrite, verify, progress), ema=ema_result
        )
    _check_destinations(where, delete_dcp)
    return _convert(where, _checked_tensors(where), dtype, delete_dcp, overwrite, verify, progress)


def _check_destinations(where: Located, delete_dcp: bool) -> None:
    """Every name this conversion will write, rename or delete, checked before anything is written: a
    symlink or a directory where a file goes, or a symlink where a directory goes, is refused in one
    line (a checkpoint someone sent may plant one to make the converter write or delete elsewhere)."""
    refuse_link(where.pretrained, "writing the converted weights")
    output = where.output
    refuse_link(output, "writing the converted weights")
    if output.is_dir():
        raise CheckpointWriteError(
            f"{output} is a directory, not a file: the converted weights cannot be written there "
            "(nothing was written; move it away and run again)",
            path=output,
        )
    if where.step_dir is not None:
        paths = CheckpointPaths(where.step_dir)
        refuse_link(paths.training_state, "updating training_step.json")
        refuse_link(paths.training_step, "updating training_step.json")
    if delete_dcp:
        refuse_link(where.dcp, "--delete_dcp")


def _check_output(where: Located, overwrite: bool) -> None:
    if where.output.exists() and not overwrite:
        raise OutputExistsError(f"{where.output} already exists; pass --overwrite to replace it")


def _write_failed(output: Path, exc: OSError) -> CheckpointError:
    """A failed write (full disk, file-size limit, quota, read-only file system) in one line that
    names the file; the checkpoint is as it was (the temporary file is removed)."""
    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
        return CheckpointWriteError(
            f"could not write {output}: {exc.strerror or exc} (nothing was written; the checkpoint is "
            "unchanged)",
            path=output,
            os_error=exc,
        )
    where = f" ({exc.filename})" if exc.filename else ""
    return CheckpointWriteError(
        f"converting into {output} failed: {exc.strerror or exc}{where} (nothing was written; the "
        "checkpoint is unchanged)",
        path=output,
        os_error=exc,
    )


def _delete_shards(where: Located) -> None:
    """Remove the shard directory: renamed in one atomic step onto an empty directory made here by
    ``mkdtemp`` (so never over a name planted in the checkpoint, and never a half-deleted directory
    under the real name), then removed. ``shutil.rmtree`` removes symlinks inside, never their
    targets; a shard directory that is itself a symlink was refused before anything was written."""
    refuse_link(where.dcp, "--delete_dcp")
    doomed = Path(tempfile.mkdtemp(prefix=f".{MODEL_DCP_DIR}.deleting-", dir=where.pretrained))
    os.rename(where.dcp, doomed)
    fsync_dir(where.pretrained)
    shutil.rmtree(doomed)


def _checked_tensors(where: Located) -> dict[str, StoredTensor]:
    """The weights of ``where``'s shards once every file is there and no record could run code;
    a non-tensor weight entry is refused (a model checkpoint holds tensors only: converting the
    rest would silently drop it)."""
    if not where.dcp.is_dir():
        raise MissingCheckpointFileError(where.dcp, _no_dcp_message(where))
    index = DcpIndex.read(where.dcp)
    index.check_files()
    check_untrusted(index)  # no record that could run code is decoded, even by the torch fallback
    if index.other_paths:
        names = sorted(".".join(map(str, p)) for p in index.other_paths)
        raise CorruptCheckpointError(
            where.dcp,
            f"{len(names)} weight entr{'y is' if len(names) == 1 else 'ies are'} not a tensor "
            f"({', '.join(names[:3])}{', …' if len(names) > 3 else ''}); weight shards hold tensors only, "
            "and converting the rest would silently drop them",
        )
    tensors = model_tensors(index)
    if not tensors:
        raise CorruptCheckpointError(where.dcp, "the shards hold no tensors")
    if RESERVED_NAME in tensors:
        raise CorruptCheckpointError(
            where.dcp,
            f"a tensor is named {RESERVED_NAME!r}, the key safetensors reserves for the file's metadata: "
            "it cannot be stored in model.safetensors (nothing was written)",
        )
    return tensors


def _convert(
    where: Located,
    tensors: dict[str, StoredTensor],
    dtype: DType | None,
    delete_dcp: bool,
    overwrite: bool,
    verify: bool,
    progress: Callable[[Progress], None] | None,
) -> ConvertResult:
    t0 = time.monotonic()
    output = where.output
    _check_destinations(where, delete_dcp)
    _check_output(where, overwrite)
    plan = SafetensorsPlan.build(
        ((name, _out_dtype(t.dtype, dtype), t.shape) for name, t in tensors.items()), FORMAT_METADATA
    )
    _check_disk(where.pretrained, plan.total_size, output)

    tmp: Path | None = None
    try:
        tmp, staged = staged_sibling(output)
        with staged:
            fd = os.dup(staged.fileno())  # the stream writer owns and closes this one
        with ChunkReader(where.dcp) as reader:
            _write(tmp, fd, tensors, plan, reader, progress)
            if verify:
                _verify(tmp, tensors, plan, reader)
        os.replace(tmp, output)
        tmp = None
        fsync_dir(where.pretrained)
    except OSError as exc:
        raise _write_failed(output, exc) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)  # our own mkstemp file, never a name found there
    record_updated = _record(where, deleting=delete_dcp)
    if delete_dcp:
        _delete_shards(where)
    return ConvertResult(
        output=output,
        tensors=len(plan.slots),
        bytes=plan.total_size,
        seconds=time.monotonic() - t0,
        verified=verify,
        deleted_dcp=delete_dcp,
        record_updated=record_updated,
    )
