"""DCP's ``.metadata`` read without torch and without running code from the file.

``.metadata`` is a pickle of ``torch.distributed.checkpoint.metadata.Metadata``; a plain
``pickle.load`` needs torch's classes (importing a CUDA build of torch alone is ~0.6 GB resident,
most of what the offline converter would otherwise cost) and would execute whatever globals the
file names. :class:`_MetadataUnpickler` instead maps each global the default ``FileSystemWriter``
pickles to a plain stand-in with the same attribute names, and refuses every other global:

* the dataclasses ``Metadata``, ``TensorStorageMetadata``, ``BytesStorageMetadata``,
  ``ChunkStorageMetadata``, ``TensorProperties`` (its tuple state, 5 or 6 fields), ``MetadataIndex``,
  ``StorageMeta`` and ``filesystem._StorageInfo`` → attribute bags filled by the pickle's ``BUILD``;
* ``torch.<dtype>`` (a dtype pickles as a global by name) → :class:`lerobot_ckpt._dtypes.DType`;
* ``torch.Size`` → ``tuple``; ``torch.serialization._get_layout`` and ``_MEM_FORMAT_ENCODING``
  (deprecated fields) → their argument; ``pathlib`` paths (``StorageMeta.checkpoint_id``) → pure paths.

Anything else (a newer torch's new class, a custom planner's, or a malicious ``os.system``) raises
:class:`UnsupportedCheckpointError` naming it; nothing outside this list is ever imported or called.
:meth:`lerobot_ckpt.dcp.index.DcpIndex.from_metadata` reads the stand-ins and torch's own objects
alike, which is how the tests check both parses agree on real checkpoints.
"""

from __future__ import annotations

import io
import os
import pickle
from collections import OrderedDict
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from lerobot_ckpt._dtypes import by_name
from lerobot_ckpt.errors import CorruptCheckpointError, UnsupportedCheckpointError
from lerobot_ckpt.paths import UnsafePathError, open_inside

_DCP = "torch.distributed.checkpoint.metadata"
_OLD_DCP = "torch.distributed._shard.sharded_tensor.metadata"  # TensorProperties' home before torch 2.2


class _Pickled:
    """A DCP dataclass as pickled: ``NEWOBJ`` makes it empty, ``BUILD`` sets its fields. Nothing runs."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) of a class with __slots__
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise pickle.UnpicklingError(
                f"unexpected state for {type(self).__name__}: {type(state).__name__}"
            )
        self.__dict__.update(state)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    def __hash__(self) -> int:
        return hash((type(self).__name__, *sorted((k, repr(v)) for k, v in self.__dict__.items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class Metadata(_Pickled):
    state_dict_metadata: dict[str, Any] | None = None  # class defaults: fields a pickle may omit
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Any = None
    version: str | None = None


class TensorStorageMetadata(_Pickled):
    properties: TensorProperties
    size: tuple[int, ...]
    chunks: list[ChunkStorageMetadata]


class BytesStorageMetadata(_Pickled):
    pass


class ChunkStorageMetadata(_Pickled):
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


class TensorProperties(_Pickled):
    """Pickled as the tuple ``(dtype, layout, requires_grad, memory format code, pin_memory[, strides])``."""

    strides: tuple[int, ...] | None = None

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            super().__setstate__(state)
            return
        if not isinstance(state, tuple) or len(state) not in (5, 6):
            raise pickle.UnpicklingError(f"unexpected TensorProperties state {state!r}")
        names = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory", "strides")
        self.__dict__.update(zip(names, state, strict=False))


class MetadataIndex(_Pickled):
    fqn: str
    offset: tuple[int, ...] | None = None
    index: int | None = None


class StorageMeta(_Pickled):
    checkpoint_id: Any = None
    save_id: str | None = None
    load_id: str | None = None
    modules: Any = ()


class StorageInfo(_Pickled):
    """``torch.distributed.checkpoint.filesystem._StorageInfo`` (``None`` fields are not pickled)."""

    relative_path: str
    offset: int
    length: int
    transform_descriptors: Any = None


def _argument(value: Any) -> Any:
    """``_get_layout("torch.strided")`` / ``_MEM_FORMAT_ENCODING(0)``: deprecated fields, kept as given."""
    return value


def _size(dims: Any = ()) -> tuple[int, ...]:
    """``torch.Size((4, 3))``."""
    return tuple(int(d) for d in dims)


_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        (module, cls.__name__): cls
        for module in (_DCP, _OLD_DCP)
        for cls in (
            Metadata,
            TensorStorageMetadata,
            BytesStorageMetadata,
            ChunkStorageMetadata,
            TensorProperties,
            MetadataIndex,
            StorageMeta,
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): StorageInfo,
    (_DCP, "_MEM_FORMAT_ENCODING"): _argument,
    (_OLD_DCP, "MEM_FORMAT_ENCODING"): _argument,
    ("torch.serialization", "_get_layout"): _argument,
    ("torch", "Size"): _size,
    ("collections", "OrderedDict"): OrderedDict,
    ("pathlib", "PosixPath"): PurePosixPath,
    ("pathlib", "PurePosixPath"): PurePosixPath,
    ("pathlib", "WindowsPath"): PureWindowsPath,
    ("pathlib", "PureWindowsPath"): PureWindowsPath,
}


ALLOWED_GLOBALS = frozenset(_GLOBALS)  # besides torch.<dtype>: what a torch-side reader may resolve


class UnknownGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.qualified = f"{module}.{name}"


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata into the stand-ins above; any other global raises :class:`UnknownGlobal`."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _GLOBALS:
            return _GLOBALS[(module, name)]
        if module == "torch" and (dtype := by_name(name)) is not None:
            return dtype
        raise UnknownGlobal(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("DCP metadata holds no persistent ids")


def load_metadata(path: Path) -> Metadata:
    """The stand-in ``Metadata`` of a ``.metadata`` file; :class:`CorruptCheckpointError` when it is
    not one, :class:`UnsupportedCheckpointError` when it names a class this reader does not know.

    The file must be a regular file of its directory (:func:`lerobot_ckpt.paths.open_inside`): a
    ``.metadata`` symlinked to another checkpoint's is refused, not followed."""
    path = Path(path)
    try:
        with open_inside(path.parent, path.name, named_by=path.parent, entry="its DCP metadata file") as f:
            data = f.read()
    except UnsafePathError:
        if os.path.lexists(path):
            raise
        raise CorruptCheckpointError(path, "cannot read DCP metadata: the file does not exist") from None
    except OSError as exc:
        raise CorruptCheckpointError(path, f"cannot read DCP metadata: {exc}") from None
    return parse_metadata(data, path)


def parse_metadata(data: bytes, path: Path) -> Metadata:
    """:func:`load_metadata` of bytes already read: the bytes a torch-side reader then unpickles with
    torch's own classes once this accepted them (only the globals listed above can occur in them)."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnknownGlobal as exc:
        raise UnsupportedCheckpointError(
            f"{path}: the DCP metadata refers to {exc.qualified}, which lerobot-ckpt's metadata reader does "
            "not know (written by an unknown storage writer or planner, or not a DCP checkpoint); it is not "
            "loaded, since unpickling it could run arbitrary code"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any other unpickling failure means the same thing
        raise CorruptCheckpointError(
            path, f"not readable DCP metadata: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(path, f"expected DCP Metadata, found {type(metadata).__name__}")
    return metadata
