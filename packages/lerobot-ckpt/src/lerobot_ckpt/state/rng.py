"""Random-number-generator states of every rank, as tensors in ``rng_state.safetensors``.

Python's and NumPy's global generators, torch's CPU generator and the current CUDA device's are
captured exactly (NumPy's cached Gaussian as float64, Python's pending ``gauss`` too), so draws
after a restore equal the draws after the save. Rank 0's entries keep LeRobot's key names, which
keeps its reader and ours compatible; rank ``r > 0`` is stored under ``rank<r>/``, because DDP ranks
are usually seeded apart and a resume on the same world size must restore each rank's own state.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch

from lerobot_ckpt.errors import CorruptCheckpointError

MT19937 = "MT19937"


def capture() -> dict[str, torch.Tensor]:
    """This process's generator states, keyed as in LeRobot's ``rng_state.safetensors``."""
    version, mt, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    if kind != MT19937:
        raise RuntimeError(f"numpy's global generator is {kind}, expected {MT19937}")
    state = {
        "py_rng_version": torch.tensor([version], dtype=torch.int64),
        "py_rng_state": torch.tensor(mt, dtype=torch.int64),
        "py_rng_has_gauss": torch.tensor([gauss_next is not None], dtype=torch.int64),
        "py_rng_gauss_next": torch.tensor([gauss_next or 0.0], dtype=torch.float64),
        "np_rng_state_values": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "np_rng_state_index": torch.tensor([pos], dtype=torch.int64),
        "np_rng_has_gauss": torch.tensor([has_gauss], dtype=torch.int64),
        "np_rng_cached_gaussian": torch.tensor([cached], dtype=torch.float64),
        "torch_rng_state": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda_rng_state"] = torch.cuda.get_rng_state()
    return state


def restore(state: dict[str, torch.Tensor]) -> None:
    """Set every generator from :func:`capture`'s output (LeRobot-written files work too)."""
    gauss = None
    if "py_rng_has_gauss" in state and int(state["py_rng_has_gauss"].item()):
        gauss = float(state["py_rng_gauss_next"].item())
    random.setstate((int(state["py_rng_version"].item()), tuple(state["py_rng_state"].tolist()), gauss))
    np.random.set_state(
        (
            MT19937,
            state["np_rng_state_values"].numpy().astype(np.uint32),
            int(state["np_rng_state_index"].item()),
            int(state["np_rng_has_gauss"].item()),
            float(state["np_rng_cached_gaussian"].item()),
        )
    )
    torch.set_rng_state(state["torch_rng_state"])
    if "torch_cuda_rng_state" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["torch_cuda_rng_state"])


_SCALARS = {
    "py_rng_version": "integer",
    "py_rng_has_gauss": "integer",
    "py_rng_gauss_next": "float",
    "np_rng_state_index": "integer",
    "np_rng_has_gauss": "integer",
    "np_rng_cached_gaussian": "float",
}
MT_WORDS = 624  # numpy's MT19937 key length


def _kind(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _scalar(state: dict[str, torch.Tensor], key: str, kind: str) -> int | float:
    t = state[key]
    if not isinstance(t, torch.Tensor) or t.numel() != 1 or t.ndim > 1:
        raise ValueError(f"{key} must hold one value, not shape {tuple(getattr(t, 'shape', ()))}")
    if kind == "integer" and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise ValueError(f"{key} must be an integer, not {_kind(t)}")
    if kind == "float" and (t.is_complex() or t.dtype == torch.bool):
        raise ValueError(f"{key} must be a number, not {_kind(t)}")
    value = t.item()
    if kind == "float" and not math.isfinite(value):
        raise ValueError(f"{key} is {value}, not a finite number")
    return value


def _problem(state: dict[str, torch.Tensor]) -> str | None:
    """Why :func:`restore` would fail on (or silently alter) ``state``, or None. Every generator is set
    on a throwaway instance, so nothing global changes."""
    try:
        values = {k: _scalar(state, k, kind) for k, kind in _SCALARS.items() if k in state}
        gauss = None
        if values.get("py_rng_has_gauss", 0) not in (0, 1):
            return f"py_rng_has_gauss is {values['py_rng_has_gauss']}, not 0 or 1"
        if values.get("py_rng_has_gauss"):
            if "py_rng_gauss_next" not in state:
                return "py_rng_has_gauss is 1 but py_rng_gauss_next is missing"
            gauss = float(values["py_rng_gauss_next"])
        mt = state["py_rng_state"]
        if mt.ndim != 1 or mt.is_floating_point() or mt.is_complex() or mt.dtype == torch.bool:
            return f"py_rng_state must be a 1-D integer tensor, not {_kind(mt)} of shape {tuple(mt.shape)}"
        try:
            random.Random().setstate((int(values["py_rng_version"]), tuple(mt.tolist()), gauss))
        except (ValueError, TypeError, OverflowError) as exc:
            return f"py_rng_version/py_rng_state are not a valid Python random state ({exc})"
        keys = state["np_rng_state_values"]
        if (
            keys.shape != (MT_WORDS,)
            or keys.is_floating_point()
            or keys.is_complex()
            or keys.dtype == torch.bool
        ):
            return (
                f"np_rng_state_values must be {MT_WORDS} integers, not {_kind(keys)} of shape "
                f"{tuple(keys.shape)}"
            )
        wide = keys.to(torch.int64)  # uint32 (LeRobot-written files) has no comparisons
        if bool(((wide < 0) | (wide > 2**32 - 1)).any()):
            return "np_rng_state_values holds values outside 0..2**32-1"
        if not 0 <= values["np_rng_state_index"] <= MT_WORDS:
            return f"np_rng_state_index is {values['np_rng_state_index']}, not in 0..{MT_WORDS}"
        if values["np_rng_has_gauss"] not in (0, 1):
            return f"np_rng_has_gauss is {values['np_rng_has_gauss']}, not 0 or 1"
        np.random.RandomState().set_state(
            (
                MT19937,
                keys.numpy().astype(np.uint32),
                int(values["np_rng_state_index"]),
                int(values["np_rng_has_gauss"]),
                float(values["np_rng_cached_gaussian"]),
            )
        )
        for key, device in (("torch_rng_state", "cpu"), ("torch_cuda_rng_state", "cuda")):
            if key not in state or (device == "cuda" and not torch.cuda.is_available()):
                continue
            t = state[key]
            if t.dtype != torch.uint8 or t.ndim != 1:
                return f"{key} must be a 1-D uint8 tensor, not {_kind(t)} of shape {tuple(t.shape)}"
            try:
                torch.Generator(device=device).set_state(t)
            except (RuntimeError, ValueError, TypeError) as exc:
                return f"{key} is not a valid generator state ({str(exc).splitlines()[0]})"
    except (ValueError, TypeError, OverflowError, RuntimeError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def check(path: Path, state: dict[str, torch.Tensor], rank: int = 0) -> dict[str, torch.Tensor]:
    """``state`` (one rank's :func:`unpack`), once every entry is checked to restore as saved: a
    :class:`CorruptCheckpointError` in one line naming the file and the entry otherwise, before any
    generator is changed."""
    problem = _problem(state)
    if problem is not None:
        where = f" (rank {rank}'s entries, prefixed {rank_prefix(rank)!r})" if rank else ""
        raise CorruptCheckpointError(path, f"{problem}{where}")
    return state


REQUIRED = (
    "py_rng_version",
    "py_rng_state",
    "np_rng_state_values",
    "np_rng_state_index",
    "np_rng_has_gauss",
    "np_rng_cached_gaussian",
    "torch_rng_state",
)


def rank_prefix(rank: int) -> str:
    return "" if rank == 0 else f"rank{rank}/"


def pack(per_rank: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """All ranks' states in one flat dict (rank 0 unprefixed)."""
    return {f"{rank_prefix(r)}{k}": v for r, state in enumerate(per_rank) for k, v in state.items()}


def unpack(flat: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor] | None:
    """One rank's states, or None when the checkpoint has none for it (it ran on fewer ranks)."""
    prefix = rank_prefix(rank)
    if rank == 0:
        mine = {k: v for k, v in flat.items() if not k.startswith("rank")}
    else:
        mine = {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
    return mine if all(k in mine for k in REQUIRED) else None


def ranks_in(flat: dict[str, torch.Tensor]) -> int:
    """How many ranks a file holds states for (rank 0 plus each ``rank<r>/`` prefix)."""
    prefixes = {k.split("/", 1)[0] for k in flat if k.startswith("rank") and "/" in k}
    return 1 + len(prefixes)
