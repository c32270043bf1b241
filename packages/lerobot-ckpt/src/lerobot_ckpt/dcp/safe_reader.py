"""The reader and planner every ``dcp.load`` here goes through, so no file of a checkpoint runs code.

torch's ``FileSystemReader.read_metadata`` unpickles ``.metadata`` with plain ``pickle.load`` and
``DefaultLoadPlanner.load_bytes`` decodes each non-tensor entry with ``torch.load(weights_only=False)``:
both execute whatever globals a crafted file names. :class:`SafeReader` reads the metadata bytes
once, lets :func:`lerobot_ckpt.dcp.metadata.parse_metadata` (an allow-list of DCP's own classes)
accept them, and only then unpickles those same bytes with torch's classes, tolerating the fields a
newer supported torch adds (torch 2.11 cannot read 2.15's ``.metadata`` on its own); :class:`SafePlanner`
decodes byte entries with :func:`lerobot_ckpt.dcp.untrusted.decode_plain` (plain data only). Tensor
records are already read by torch with ``weights_only=True``.

The resume checks the same records before anything changes
(:func:`~lerobot_ckpt.dcp.untrusted.check_untrusted`); this is the load itself holding to the same rule,
whatever happened to the files in between.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorProperties
from torch.distributed.checkpoint.planner import ReadItem

from lerobot_ckpt._dtypes import by_name
from lerobot_ckpt.dcp.metadata import ALLOWED_GLOBALS, parse_metadata
from lerobot_ckpt.dcp.untrusted import decode_plain


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


class SafeReader(dcp.FileSystemReader):
    """``FileSystemReader`` whose metadata passes the allow-list before torch's classes are built."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            data = f.read()
        parse_metadata(data, Path(path))  # raises on any global outside DCP's own classes
        metadata = _TorchMetadataUnpickler(io.BytesIO(data)).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


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
