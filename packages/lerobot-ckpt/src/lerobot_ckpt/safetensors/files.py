"""safetensors files with the two things ``save_file`` refuses: shared storage and odd devices.

Tied weights (one tensor under two names) are written once and the other names recorded in the
file's metadata as ``{alias: kept_name}`` — the convention of ``safetensors.torch.save_model``,
so LeRobot's ``from_pretrained`` and ours read each other's files. Tensors that merely overlap
in memory (views of one buffer) are copied apart instead, since no alias can express them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lerobot_ckpt.errors import CorruptCheckpointError, MissingCheckpointFileError
from lerobot_ckpt.safetensors.stream import FORMAT_METADATA  # defined there, torch-free, for the converter

__all__ = ["FORMAT_METADATA", "prepare", "read_tensors", "write_tensors"]


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr(), a.shape, a.stride(), a.dtype) == (b.data_ptr(), b.shape, b.stride(), b.dtype)


def prepare(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors safe to hand to ``save_file`` (CPU, contiguous, unshared) and the alias map."""
    by_storage: dict[tuple[torch.device, int], list[str]] = defaultdict(list)
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(tensor).__name__}")
        if tensor.numel():
            by_storage[(tensor.device, tensor.untyped_storage().data_ptr())].append(name)
    aliases: dict[str, str] = {}
    copy_apart: set[str] = set()
    for names in by_storage.values():
        if len(names) < 2:
            continue
        names = sorted(names)
        first = state[names[0]]
        if all(_same_view(first, state[n]) for n in names[1:]):
            aliases.update({n: names[0] for n in names[1:]})
        else:
            copy_apart.update(names)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name in aliases:
            continue
        t = tensor.detach()
        if name in copy_apart:
            t = t.clone(memory_format=torch.contiguous_format)
        out[name] = t.to("cpu").contiguous()
    return out, aliases


def write_tensors(
    path: Path, state: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``state`` to ``path``; ties become header aliases. Raises OSError/SafetensorError as-is."""
    tensors, aliases = prepare(state)
    header = {**FORMAT_METADATA, **aliases, **(metadata or {})}
    save_file(tensors, str(path), metadata=header)


def read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors of a file (aliases expanded back to shared tensors) and its header metadata."""
    if not path.is_file():
        raise MissingCheckpointFileError(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        size = path.stat().st_size if path.exists() else 0
        raise CorruptCheckpointError(path, f"not a readable safetensors file ({size} bytes): {exc}") from None
    for alias, kept in metadata.items():
        if alias not in tensors and kept in tensors:
            tensors[alias] = tensors[kept]
    return tensors, metadata
