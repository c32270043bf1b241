"""Process group, device and device mesh of one training process.

:class:`ParallelRuntime` is the one object the rest of the stack asks "who am I in this job"
(modelled on torchtitan's ``ParallelDims``, written fresh): ranks, the resolved degrees, the
device and the mesh. It is frozen because every one of these facts is fixed at launch, and a
copy that drifted from the process group would make ranks disagree about collectives.

The runtime owns the topology: its degrees are resolved for its world size (checked when it is
built), :attr:`ParallelRuntime.mesh_dims` is the one definition of the mesh's shape, and
:meth:`ParallelRuntime.build_mesh` the one place a mesh is made from it. A sharding plan reads
the dims from the runtime and the wrapping code takes ``runtime.mesh`` as is, so nothing can
disagree about them. The dims are named like the config fields: ``("dp_replicate",)`` for DDP,
``("dp_shard",)`` for FSDP and ``("dp_replicate", "dp_shard")`` for HSDP. A single process gets no
process group and no mesh: nothing in a one-process run needs one, and creating one would need a
free port. :meth:`ParallelRuntime.preview` is a runtime for planning a launch from one process
(``--dry_run``): the degrees and dims of that launch, no group, no mesh.
"""

from __future__ import annotations

import datetime
import warnings

import torch
import torch.distributed as dist
from attrs import define, evolve
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from lerobot_parallel.config import AcceleratorConfig, ParallelismConfig
from lerobot_parallel.errors import ParallelismError
from lerobot_parallel.launch_env import LaunchEnv


@define(frozen=True)
class ParallelRuntime:
    """Where this process sits in the job. Build it with :func:`init_runtime`."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None: no process group (single process)
    parallelism: ParallelismConfig  # resolved against world_size
    mesh: DeviceMesh | None
    timeout_s: float = 1800.0
    owns_process_group: bool = False  # False when a foreign trainer created it: we must not destroy it
    launcher: str = "none"

    def __attrs_post_init__(self) -> None:
        p = self.parallelism
        if p.dp_shard == -1 or p.dp_world_size != self.world_size:
            raise ParallelismError(
                f"a runtime of {self.world_size} process(es) needs degrees resolved for that world size, got "
                f"dp_replicate={p.dp_replicate} x dp_shard={p.dp_shard}: use parallelism.resolve(world_size)"
            )

    @classmethod
    def single(cls, device: str | torch.device | None = None) -> ParallelRuntime:
        """A one-process runtime with no process group (also usable while one exists,
        e.g. a reference run)."""
        return cls(
            rank=0,
            world_size=1,
            local_rank=0,
            device=resolve_device(device, 0, 1),
            backend=None,
            parallelism=ParallelismConfig().resolve(1),
            mesh=None,
        )

    @classmethod
    def preview(cls, parallelism: ParallelismConfig) -> ParallelRuntime:
        """The topology a launch with these *resolved* degrees would have, seen from rank 0 without
        joining it: for planning in one process (``build_plan`` for ``--dry_run``). It has no process
        group and no mesh, so ``wrap_model`` refuses it for anything but a single process."""
        return cls(
            rank=0,
            world_size=parallelism.dp_world_size,
            local_rank=0,
            device=torch.device("cpu"),
            backend=None,
            parallelism=parallelism,
            mesh=None,
            launcher="preview",
        )

    @property
    def mesh_dims(self) -> tuple[tuple[str, int], ...]:
        """``(name, size)`` of each mesh dim, outermost first: the dp dims of size > 1, so DDP and FSDP
        get a 1-D mesh and only HSDP a 2-D one (``(("dp_replicate", 1),)`` when every degree is 1).
        The mesh, when there is one, has exactly these dims; a sharding plan records them."""
        p = self.parallelism
        dims = tuple((n, s) for n, s in (("dp_replicate", p.dp_replicate), ("dp_shard", p.dp_shard)) if s > 1)
        return dims or (("dp_replicate", 1),)

    def build_mesh(self) -> DeviceMesh:
        """Create the device mesh of :attr:`mesh_dims` on this runtime's device type (every rank of
        the process group must call it; :func:`init_runtime` does, once)."""
        names, sizes = zip(*self.mesh_dims, strict=True)
        return init_device_mesh(self.device.type, sizes, mesh_dim_names=names)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def mode(self) -> str:
        return self.parallelism.mode

    @property
    def dp_world_size(self) -> int:
        return self.parallelism.dp_world_size

    def _coord(self, dim: str) -> int:
        if self.mesh is None or self.mesh.mesh_dim_names is None or dim not in self.mesh.mesh_dim_names:
            return 0
        return self.mesh.get_local_rank(dim)

    @property
    def dp_replicate_rank(self) -> int:
        return self._coord("dp_replicate")

    @property
    def dp_shard_rank(self) -> int:
        return self._coord("dp_shard")

    @property
    def dp_rank(self) -> int:
        """Which slice of each global batch this process loads (from mesh coordinates, not the
        global rank, so it stays right once non-dp dims such as TP join the mesh)."""
        return self.dp_replicate_rank * self.parallelism.dp_shard + self.dp_shard_rank

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """Group over which metrics and gradients are averaged; None in a single process."""
        if self.mesh is None:
            return None
        if self.mesh.ndim == 1:
            return self.mesh.get_group()
        return dist.group.WORLD  # data parallelism spans the whole world until other dims exist

    def describe(self) -> str:
        """One banner line: topology, backend and device."""
        p = self.parallelism
        return (
            f"world {self.world_size} ({self.mode}: dp_replicate={p.dp_replicate} x dp_shard={p.dp_shard}), "
            f"backend {self.backend or 'none'}, device {self.device}, launcher {self.launcher}"
        )


def _accelerator_type() -> str | None:
    acc = torch.accelerator.current_accelerator(check_available=True)
    return None if acc is None else acc.type


def resolve_device(
    choice: str | torch.device | None, local_rank: int, local_world_size: int = 1
) -> torch.device:
    """The device this rank computes on.

    ``None``/``"auto"``: the local accelerator at index ``LOCAL_RANK`` if there is one, else CPU.
    An explicit type (``"cpu"``, ``"cuda"``, ``"xpu"`` …) is respected; without an index it gets
    ``LOCAL_RANK``. An explicit index (``"cuda:0"``, typical of a single-GPU config) cannot be
    honoured when several processes share the node, so it is replaced by ``LOCAL_RANK`` with a warning.
    """
    if choice is None or (isinstance(choice, str) and choice.strip().lower() == "auto"):
        dev_type = _accelerator_type()
        if dev_type is None:
            return torch.device("cpu")
        index = None
    else:
        try:
            requested = torch.device(choice)
        except RuntimeError as exc:
            raise ParallelismError(
                f"device={choice}: not a torch device ({str(exc).splitlines()[0]}); use cpu, cuda or auto"
            ) from None
        if requested.type in ("cpu", "meta"):
            return torch.device(requested.type)
        dev_type, index = requested.type, requested.index
        if _accelerator_type() != dev_type:
            raise ParallelismError(
                f"device {str(choice)!r} was requested but no {dev_type} device is available here "
                f"(available accelerator: {_accelerator_type() or 'none'}); choose device 'cpu' or 'auto'"
            )
    if index is not None and local_world_size > 1 and index != local_rank:
        warnings.warn(
            f"device {dev_type}:{index} was requested, but {local_world_size} processes share this node; "
            f"local rank {local_rank} uses {dev_type}:{local_rank} instead",
            stacklevel=2,
        )
        index = None
    if index is None:
        index = local_rank
    count = torch.accelerator.device_count()
    if index >= count:
        raise ParallelismError(
            f"local rank {local_rank} needs {dev_type}:{index}, but only {count} {dev_type} device(s) are "
            f"visible; launch at most {count} process(es) per node, or use device 'cpu'"
        )
    return torch.device(dev_type, index)


def backend_for(device: torch.device, cpu_collectives: bool = False) -> str:
    """nccl for CUDA, gloo for CPU, torch's default for other accelerators (xccl, hccl …).

    ``cpu_collectives``: the run also reduces tensors that live in host memory (FSDP2 with CPU offload:
    the sharded gradients and their clip norm are on the CPU), which nccl cannot; CUDA then gets
    ``cuda:nccl,cpu:gloo``, one group whose collectives go to nccl or gloo by the tensors' device.
    """
    if device.type == "cpu":
        return "gloo"
    if device.type == "cuda":
        return "cuda:nccl,cpu:gloo" if cpu_collectives else "nccl"
    return dist.get_default_backend_for_device(device)


_groups_created = 0  # process groups this process has created (see _init_process_group)


def _init_process_group(
    backend: str, rank: int, world: int, timeout: datetime.timedelta, device_id: torch.device | None
) -> None:
    """``init_process_group`` from the launcher's env, safe to repeat after a teardown.

    torch names the default group's store keys by a counter that ``destroy_process_group``
    resets, and torchrun's agent store outlives our group, so a second group in the same
    process would read the first one's stale peer addresses and hang in gloo's connect. Every
    group after the first therefore gets its own key prefix (every rank counts alike, since
    sessions are collective).
    """
    global _groups_created
    if _groups_created == 0:
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=rank,
            world_size=world,
            timeout=timeout,
            device_id=device_id,
        )
    else:
        store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
        store = dist.PrefixStore(f"lerobot_parallel/session{_groups_created}", store)
        dist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world, timeout=timeout, device_id=device_id
        )
    _groups_created += 1


def init_runtime(
    parallelism: ParallelismConfig | None = None,
    accelerator: AcceleratorConfig | None = None,
    *,
    device: str | torch.device | None = None,
    launch: LaunchEnv | None = None,
) -> ParallelRuntime:
    """Join the job described by the launcher's environment and return this process's runtime.

    Degrees are resolved *before* the process group is created: a bad topology is the same error
    on every rank and must exit promptly instead of waiting for a rendezvous. A process group a
    foreign trainer already created is adopted and left for it to destroy.
    """
    parallelism = parallelism or ParallelismConfig()
    accelerator = accelerator or AcceleratorConfig()
    launch = launch or LaunchEnv.from_environ()
    adopted = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if adopted else (launch.rank, launch.world_size)
    resolved = parallelism.resolve(world)
    dev = resolve_device(device, launch.local_rank, launch.local_world_size)
    if world == 1:
        return ParallelRuntime(
            rank=0,
            world_size=1,
            local_rank=launch.local_rank,
            device=dev,
            backend=None,
            parallelism=resolved,
            mesh=None,
            timeout_s=accelerator.timeout_s,
            launcher=launch.launcher,
        )
    if dev.type != "cpu":
        torch.accelerator.set_device_index(dev.index)
    if adopted:
        backend = dist.get_backend()
    else:
        if launch.master_addr is None or launch.master_port is None:
            raise ParallelismError(  # a usage error, before any process group: a CLI exits 2
                f"{world} processes were launched but MASTER_ADDR/MASTER_PORT are not set; "
                "launch with torchrun or accelerate launch"
            )
        backend = backend_for(dev, cpu_collectives=resolved.is_sharded and accelerator.fsdp.cpu_offload)
        _init_process_group(
            backend,
            rank,
            world,
            datetime.timedelta(seconds=accelerator.timeout_s),
            dev if "nccl" in backend else None,
        )
    runtime = ParallelRuntime(
        rank=rank,
        world_size=world,
        local_rank=launch.local_rank,
        device=dev,
        backend=backend,
        parallelism=resolved,
        mesh=None,
        timeout_s=accelerator.timeout_s,
        owns_process_group=not adopted,
        launcher=launch.launcher,
    )
    return evolve(runtime, mesh=runtime.build_mesh())
