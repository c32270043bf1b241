"""The reader and planner every ``dcp.load`` here goes through, so no file of a checkpoint runs code.

torch's ``FileSystemReader.read_metadata`` unpickles ``.metadata`` with plain ``pickle.load`` and
``DefaultLoadPlanner.load_bytes`` decodes each non-tensor entry with ``torch.load(weights_only=False)``:
both execute whatever globals a crafted file names. :class:`SafeReader` reads the metadata bytes
once, lets :func:`lerobot_ckpt.dcp.metadata.parse_metadata` (an allow-list of DCP's own classes)
accept them, and only then unpickles those same bytes with torch's classes, tolerating the fields a
newer supported torch adds (torch 2.11 cannot read 2.15's ``.metadata`` on its own); :class:`SafePlanner`
decodes byte entries with :func:`lerobot_ckpt.dcp.untrusted.decode_plain` (plain data only). Tensor
records are already read by torch with ``weights_only=True``.

torch joins each chunk's ``relative_path`` to the directory and opens it as it is: an absolute path,
``../`` or a symlinked shard would load another checkpoint's weights. The reader therefore checks every
storage entry as :class:`~lerobot_ckpt.dcp.index.DcpIndex` does
(:func:`~lerobot_ckpt.dcp.index.check_storage`, on the metadata it read and on the one a coordinator
broadcast), and its file system opens every file
through :func:`lerobot_ckpt.paths.open_inside`, so torch opens only checked names, never through a
symlink, whatever changed on disk after the check.

The resume checks the same records before anything changes
(:func:`~lerobot_ckpt.dcp.untrusted.check_untrusted`); this is the load itself holding to the same rule,
whatever happened to the files in between.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorProperties
from torch.distributed.checkpoint.planner import ReadItem

from lerobot_ckpt._dtypes import by_name
from lerobot_ckpt.dcp.index import METADATA_FILE, check_storage
from lerobot_ckpt.dcp.metadata import ALLOWED_GLOBALS, parse_metadata
from lerobot_ckpt.dcp.untrusted import decode_plain
from lerobot_ckpt.errors import CheckpointError, UnsafeCheckpointError
from lerobot_ckpt.paths import UnsafePathError, open_inside


class _TensorProperties(TensorProperties):
    """The running torch's ``TensorProperties``, reading the pickled state of any supported torch: a newer
    torch pickles more fields (2.12 added ``strides``), which an older one's ``__setstate__`` rejects."""

    def __setstate__(self, state: Any) -> None:
        known = len(dataclasses.fields(TensorProperties))
        super().__setstate__(state[:known] if isinstance(state, tuple) else state)


class _TorchMetadataUnpickler(pickle.Unpickler):
    """Unpickles ``.metadata`` into torch's own classes, for exactly the globals
    :func:`~lerobot_ckpt.dcp.metadata.parse_metadata` allows (it has accepted the bytes already)."""

    def find_class(self, module: str, name: str) -> Any:
        if name == "TensorProperties":
            return _TensorProperties
        if (module, name) in ALLOWED_GLOBALS or (module == "torch" and by_name(name) is not None):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")


class _InsideFileSystem(FileSystem):
    """torch's local file system, reading only files inside the reader's directory: each path torch
    builds (``directory / relative_path``) is opened by :func:`~lerobot_ckpt.paths.open_inside`."""

    def __init__(self, reader: SafeReader) -> None:
        super().__init__()
        self._reader = reader

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        root = Path(self._reader.path)
        named_by = root / METADATA_FILE
        if mode != "rb":
            raise UnsafeCheckpointError(f"{root}: a checkpoint reader opened {path} with mode {mode!r}")
        given = Path(path)
        if not given.is_relative_to(root):  # torch's `root / relative_path` with an absolute one
            raise UnsafePathError(named_by, "a relative_path", str(path), "is an absolute path")
        relative = given.relative_to(root).as_posix()
        with open_inside(root, relative, named_by=named_by, entry="a relative_path") as stream:
            yield stream


class SafeReader(dcp.FileSystemReader):
    """``FileSystemReader`` whose metadata passes the allow-list before torch's classes are built, whose
    storage entries pass :func:`~lerobot_ckpt.dcp.index.check_storage`, and which opens only files
    inside its directory (:class:`_InsideFileSystem`)."""

    def __init__(self, path: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.fs = _InsideFileSystem(self)
        self.refusal: CheckpointError | None = None  # why .metadata was refused, for the caller's one line

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """torch logs a failed read and falls back to a rank's own ``__<rank>.metadata``: after a
        refusal that fallback is refused too (a crafted ``.metadata`` beside a clean rank file would
        otherwise load), and the refusal is kept in :attr:`refusal` for the caller to report."""
        if kwargs.get("rank") is not None and self.refusal is not None:
            raise self.refusal
        try:
            return self._read_metadata(kwargs.get("rank"))
        except CheckpointError as exc:
            self.refusal = self.refusal or exc
            raise

    def _read_metadata(self, rank: int | None) -> Metadata:
        path = self._get_metadata_path(rank)
        with self.fs.create_stream(path, "rb") as f:
            data = f.read()
        standin = parse_metadata(data, Path(path))  # raises on any global outside DCP's own classes
        check_storage(standin, Path(path))  # every relative_path, offset and length, before any shard
        metadata = _TorchMetadataUnpickler(io.BytesIO(data)).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Every rank checks the storage entries it will read (a non-coordinator's metadata arrives
        broadcast, not read here)."""
        check_storage(metadata, Path(self.path) / METADATA_FILE)
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)


class SafePlanner(dcp.DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose byte entries are decoded as plain data (no code runs)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = Path(directory)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        decoded = decode_plain(value.getvalue(), fqn, self.directory)  # fqn: the dotted path
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], decoded)
        else:
            self.state_dict[fqn] = decoded
