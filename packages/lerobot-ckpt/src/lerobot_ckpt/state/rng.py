"""Random-number-generator states of every rank, as tensors in ``rng_state.safetensors``.

Python's and NumPy's global generators, torch's CPU generator and the current CUDA device's are
captured exactly (NumPy's cached Gaussian as float64, Python's pending ``gauss`` too), so draws
after a restore equal the draws after the save. Rank 0's entries keep LeRobot's key names, which
keeps its reader and ours compatible; rank ``r > 0`` is stored under ``rank<r>/``, because DDP ranks
are usually seeded apart and a resume on the same world size must restore each rank's own state.
"""

from __future__ import annotations

import random

import numpy as np
import torch

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
