"""Setup recipes and file snapshots for the bad-input table (``tests/data/bad_inputs.json``).

A row names *what* to break in data, not in code, so the table can grow without new Python: it
starts from a copy of something real (the shipped demo dataset, a checkpoint a real run wrote, or
an empty directory) and applies a list of small edits. The same module takes byte snapshots of
everything a row set up, because a refused command must leave the user's files exactly as they
were.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
TOKENS = ("{setup}", "{out}", "{demo}")


def fill(value: Any, places: dict[str, Path]) -> Any:
    """Replace ``{setup}``/``{out}``/``{demo}`` in strings, lists and dict values.

    Plain ``str.replace`` rather than ``str.format``: rows carry JSON flag values with braces.
    """
    if isinstance(value, str):
        for token in TOKENS:
            if token in value:
                value = value.replace(token, str(places[token[1:-1]]))
        return value
    if isinstance(value, list):
        return [fill(v, places) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, places) for k, v in value.items()}
    return value


def _json_edit(path: Path, dotted: str | list[str], fn: Callable[[dict, str], None]) -> None:
    """``dotted``: ``"a.b.c"``, or a list of keys when a key itself has dots
    (``["observation.state", "std"]``)."""
    data = json.loads(path.read_text())
    *parents, leaf = dotted if isinstance(dotted, list) else dotted.split(".")
    node = data
    for part in parents:
        node = node[part]
    fn(node, leaf)
    path.write_text(json.dumps(data, indent=4))


def _set(node: dict, key: str, value: Any) -> None:
    node[key] = value


def _drop_column(path: Path, column: str) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    assert column in table.column_names, f"recipe error: {path} has no column {column!r} to drop"
    pq.write_table(table.drop_columns([column]), path)


def _dcp_from_model(pretrained: Path, extra: dict[str, Any] | None = None) -> None:
    """Write ``pytorch_model_fsdp_0/`` (DCP, key nesting ``model.<name>``) from ``model.safetensors``.

    What a ``--checkpoint_format=safetensors_dcp`` run leaves: both artifacts side by side. Built in
    one process (DCP needs no process group) so a converter row does not need an FSDP launch.
    ``extra``: more model entries (plain values: DCP stores them as non-tensor byte entries).
    """
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(
            {"model": {**load_file(pretrained / "model.safetensors"), **(extra or {})}},
            checkpoint_id=str(pretrained / "pytorch_model_fsdp_0"),
        )


def _to_dtype(weights: Path, dtype: str) -> None:
    """Rewrite a safetensors file with its floating tensors in ``dtype`` (a bf16/fp16 base policy)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    save_file(
        {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in tensors.items()},
        weights,
        metadata={"format": "pt"},
    )


def apply_edit(root: Path, edit: dict[str, Any]) -> None:
    """One edit, relative to the setup directory ``root``; unknown ops fail the test loudly."""
    ((op, arg),) = edit.items()
    args = arg if isinstance(arg, list) else [arg]
    target = root / args[0]
    if op == "remove":
        assert target.exists() or target.is_symlink(), f"recipe error: nothing to remove at {target}"
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    elif op == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif op == "garble":  # same size, other bytes: every size check passes, the content is garbage
        target.write_bytes(random.Random(0).randbytes(target.stat().st_size))
    elif op == "header_length":  # a safetensors file whose 8-byte header length says [file, length]
        data = target.read_bytes()
        target.write_bytes(struct.pack("<Q", int(args[1])) + data[8:])
    elif op == "write":
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(args[1])
    elif op == "json_set":
        _json_edit(target, args[1], lambda node, key: _set(node, key, args[2]))
    elif op == "json_del":
        _json_edit(target, args[1], lambda node, key: node.pop(key))
    elif op == "drop_column":
        _drop_column(target, args[1])
    elif op == "dcp_from_model":  # "dir" or [dir, {extra model entries}]
        _dcp_from_model(target, args[1] if len(args) > 1 else None)
    elif op == "to_dtype":
        _to_dtype(target, args[1])
    elif op in ("copy", "move"):  # [source, destination], both relative to the setup directory
        destination = root / args[1]
        destination.parent.mkdir(parents=True, exist_ok=True)
        if op == "move":
            shutil.move(target, destination)
        elif target.is_dir():
            shutil.copytree(target, destination, symlinks=True)
        else:
            shutil.copy2(target, destination)
    else:
        raise AssertionError(f"recipe error: unknown edit {op!r}")


def build_setup(
    setup: dict[str, Any], root: Path, checkpoint_run: Callable[[], Path], places: dict[str, Path]
) -> None:
    """``from``: ``demo`` (dataset copy), ``checkpoint`` (copy of a real run dir) or ``empty``."""
    source = setup.get("from", "empty")
    if source == "demo":
        shutil.copytree(DEMO, root, symlinks=True)
    elif source == "checkpoint":
        shutil.copytree(checkpoint_run(), root, symlinks=True)  # `last` is a relative link: stays inside
    elif source == "empty":
        root.mkdir(parents=True)
    else:
        raise AssertionError(f"recipe error: unknown setup source {source!r}")
    for edit in setup.get("edits", []):
        apply_edit(root, fill(edit, places))


def snapshot(root: Path) -> dict[str, Any]:
    """Bytes of every file and the target of every link under ``root`` (directories by name)."""
    out: dict[str, Any] = {}
    if not root.exists() and not root.is_symlink():
        return out
    if root.is_file():
        return {".": root.read_bytes()}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in dirnames + filenames:
            path = base / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = path.read_bytes()
    return out
