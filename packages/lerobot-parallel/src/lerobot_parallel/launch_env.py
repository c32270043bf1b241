"""What the launcher told this process about its place in the job (torch-free).

torchrun (and ``accelerate launch --multi_gpu``, which runs torchrun in-process) exports
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``. ``accelerate launch``
with ``--mpirun_hostfile`` leaves ranks to MPI, which names them differently; the fallbacks
below are the ones accelerate itself reads, so a job accelerate can launch is one we can join.

A plain ``accelerate launch --num_processes=N`` on a machine without GPUs starts ONE process
and exports ``MASTER_ADDR``/``MASTER_PORT`` but no rank or world size: that is a
single-process run, which is why the world size, not the presence of ``MASTER_ADDR``,
decides whether a process group is needed.

The reverse, a world size above 1 without the rank and rendezvous address that go with it
(``WORLD_SIZE=2 lerobot-train …`` typed by hand, or left over in a shell), is refused here:
torch would otherwise fail deep in ``init_process_group`` with a traceback, or wait forever
for peers that were never started.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from attrs import define

from lerobot_parallel.errors import ParallelismError

_RANK = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
_WORLD = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_LOCAL_RANK = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")
_LOCAL_WORLD = (
    "LOCAL_WORLD_SIZE",
    "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_LOCAL_SIZE",
)


class LaunchEnvError(ParallelismError):
    """The launcher's variables cannot describe a job (a usage error: a CLI exits 2, no traceback)."""


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> tuple[int, str | None]:
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            try:
                return int(raw), name
            except ValueError:
                raise LaunchEnvError(f"environment variable {name}={raw!r} is not an integer") from None
    return default, None


def _check_rendezvous(env: Mapping[str, str], world: int, has_rank: bool) -> None:
    """Several processes need a rank each and one address to meet at; torchrun sets all of them.

    Only for the torchrun names: MPI always sets its rank with its size, and a missing
    ``MASTER_ADDR`` there is reported by ``init_runtime``, still before any process group.
    """
    missing = [] if has_rank else ["RANK"]
    missing += [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name, "").strip()]
    if not missing:
        return
    verb = "is" if len(missing) == 1 else "are"
    raise LaunchEnvError(
        f"WORLD_SIZE={world} is set but {'/'.join(missing)} {verb} not: start the processes with torchrun "
        "or accelerate launch (they set all of these), or unset WORLD_SIZE to train in one process"
    )


@define(frozen=True)
class LaunchEnv:
    """Ranks as exported by the launcher; ``world_size == 1`` when nothing was exported."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"  # "torchrun", "mpi" or "none": for banners and error messages only

    @property
    def is_multi_process(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> LaunchEnv:
        env = os.environ if environ is None else environ
        world, world_name = _first_int(env, _WORLD, 1)
        rank, rank_name = _first_int(env, _RANK, 0)
        local_rank, _ = _first_int(env, _LOCAL_RANK, 0)
        local_world, _ = _first_int(env, _LOCAL_WORLD, world)
        if world < 1:
            raise LaunchEnvError(f"{world_name}={world} is not a valid world size (must be ≥ 1)")
        if not 0 <= rank < world:
            raise LaunchEnvError(
                f"rank {rank} is outside the world of {world} process(es) exported by the launcher"
            )
        if not 0 <= local_rank < max(local_world, 1):
            raise LaunchEnvError(
                f"local rank {local_rank} is outside the {local_world} process(es) on this node"
            )
        if world > 1 and world_name == "WORLD_SIZE":
            _check_rendezvous(env, world, rank_name is not None)
        port_raw = env.get("MASTER_PORT", "").strip()
        launcher = "none"
        if world_name == "WORLD_SIZE" or "TORCHELASTIC_RUN_ID" in env:
            launcher = "torchrun"
        elif world_name is not None:
            launcher = "mpi"
        return cls(
            rank=rank,
            world_size=world,
            local_rank=local_rank,
            local_world_size=local_world,
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=int(port_raw) if port_raw.isdigit() else None,
            launcher=launcher,
        )
