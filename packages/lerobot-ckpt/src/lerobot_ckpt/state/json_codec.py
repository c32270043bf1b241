"""Plain-Python ``state_dict``s (schedulers, loss scalers, optimizer extras) as JSON.

JSON loses what these dicts rely on: tuples (Adam's ``betas``), integer keys
(``MultiStepLR.milestones`` is a ``Counter`` of ints) and the odd tensor (a tensor ``lr`` ends up in a
scheduler's ``_last_lr``; LBFGS keeps lists of tensors). Decoding is guided by the live object's
current ``state_dict()`` — same class, same shapes — which restores tuples, int keys and devices;
tensors become ``{"__tensor__": ref}``, where the caller decides what a ref is (inline values for
JSON files, a tensor name when a safetensors file travels alongside). Anything else is refused at
save time with the key that holds it, instead of being pickled.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lerobot_ckpt.errors import CheckpointConfigError, CorruptCheckpointError, MissingCheckpointFileError

TENSOR = "__tensor__"
StoreTensor = Callable[[str, torch.Tensor], Any]
FetchTensor = Callable[[Any], torch.Tensor]


def inline_tensor(where: str, tensor: torch.Tensor) -> dict[str, Any]:
    """Small tensors written out in full; float→JSON→float is exact for every real dtype torch has."""
    t = tensor.detach().cpu()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "data": t.reshape(-1).tolist(),
    }


def inline_fetch(ref: Any) -> torch.Tensor:
    try:
        dtype = getattr(torch, ref["dtype"])
        return torch.tensor(ref["data"], dtype=dtype).reshape(ref["shape"])
    except (KeyError, TypeError, AttributeError, RuntimeError) as exc:
        raise ValueError(f"bad inline tensor {str(ref)[:80]}: {exc}") from None


def to_json(value: Any, where: str, store: StoreTensor = inline_tensor) -> Any:
    """A JSON-ready copy of ``value``; ``where`` names the key path in errors (and for ``store``)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value  # inf/nan are written as Infinity/NaN (ReduceLROnPlateau keeps best=inf)
    if isinstance(value, torch.Tensor):
        return {TENSOR: store(where, value)}
    if isinstance(value, list | tuple):
        return [to_json(v, f"{where}[{i}]", store) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise CheckpointConfigError(f"{where}: key {key!r} is not a string or integer")
            out[str(key)] = to_json(v, f"{where}.{key}", store)
        return out
    raise CheckpointConfigError(
        f"{where} holds a {type(value).__name__}, which cannot be written as JSON "
        "(store it elsewhere or convert it to a plain number/string)"
    )


def like(value: Any, template: Any, fetch: FetchTensor = inline_fetch) -> Any:
    """``value`` (decoded JSON) with the container, key and tensor types of ``template``."""
    if isinstance(value, dict) and set(value) == {TENSOR}:
        tensor = fetch(value[TENSOR])
        return tensor.to(template.device) if isinstance(template, torch.Tensor) else tensor
    if isinstance(value, list):
        items = template if isinstance(template, list | tuple) else ()
        out = [like(v, items[i] if i < len(items) else None, fetch) for i, v in enumerate(value)]
        return tuple(out) if isinstance(template, tuple) else out
    if isinstance(value, dict):
        keys = template if isinstance(template, dict) else {}
        int_keys = any(isinstance(k, int) and not isinstance(k, bool) for k in keys)
        decoded = {}
        for key, v in value.items():
            real_key: Any = int(key) if int_keys and key.lstrip("-").isdigit() else key
            decoded[real_key] = like(v, keys.get(real_key), fetch)
        if isinstance(template, dict) and type(template) is not dict:
            try:
                return type(template)(decoded)  # e.g. collections.Counter
            except TypeError:
                return decoded
        return decoded
    if isinstance(template, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def write(path: Path, state: Any, what: str) -> None:
    from lerobot_ckpt.commit.filesystem import write_json

    write_json(path, to_json(state, what))


def read(path: Path) -> Any:
    if not path.is_file():
        raise MissingCheckpointFileError(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(path, str(exc)) from None
