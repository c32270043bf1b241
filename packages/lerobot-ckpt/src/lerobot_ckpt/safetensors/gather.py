"""Gathered ``model.safetensors`` from a sharded model: collective, tensor by tensor, main rank writes.

``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` would put the whole model in the
main rank's CPU memory and ``save_file`` would then copy it again. Here the main rank assembles
one tensor at a time into a buffer sized for the largest tensor, streams it into the file and
reuses the buffer for the next one. The values are the sharded parameters themselves, i.e. FSDP's
fp32 master weights even under mixed precision.

FSDP2/HSDP parameters are ``Shard(0)`` along one mesh dim (replicated along the other): for those
the peers of the main rank's shard group *send* their rows straight into the buffer (point-to-
point), instead of ``DTensor.full_tensor()``. That matters for the memory promise: an all-gather
allocates a fresh full tensor per parameter on every rank (plus backend temporaries), and glibc
keeps much of that freed memory (measured: rank-0 RSS grew by ~0.55× the model over 16 tensors),
while the reused buffer keeps the main rank at one tensor and the peers at nothing extra. Other
placements (tensor parallel, strided shards) fall back to ``full_tensor()``.

Ranks must issue the same collectives in the same order, so a main rank whose write fails keeps
receiving (without writing) until the end and raises afterwards; the save's error agreement then
reports it on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from lerobot_ckpt._snapshot import copy_tensor
from lerobot_ckpt.errors import CheckpointConfigError
from lerobot_ckpt.safetensors.files import FORMAT_METADATA
from lerobot_ckpt.safetensors.stream import ReusableBuffer, SafetensorsPlan, SafetensorsStreamWriter

Piece = tuple[int, int, int]  # (global rank, first row, rows)


def plan_for(state: Mapping[str, torch.Tensor], aliases: Mapping[str, str]) -> SafetensorsPlan:
    specs = []
    for name, value in state.items():
        if name in aliases:
            continue
        if not isinstance(value, torch.Tensor):
            raise CheckpointConfigError(
                f"model state {name!r} is a {type(value).__name__}, not a tensor; "
                "safetensors can only hold tensors"
            )
        specs.append((name, value.dtype, tuple(value.shape)))
    return SafetensorsPlan.build(specs, {**FORMAT_METADATA, **aliases})


def row_pieces(value: DTensor, main: int = 0) -> list[Piece] | None:
    """Who holds which rows, for the shard group that contains the main rank; None when ``value`` is
    not ``Shard(0)`` along exactly one mesh dim and replicated along the others.

    Row ranges follow ``torch.chunk`` (DTensor's ``Shard`` semantics, FSDP2's too): every rank has
    ``ceil(rows / n)`` rows except the trailing ones, which may have fewer or none.
    """
    placements = value.placements
    shard_dims = [i for i, p in enumerate(placements) if type(p) is Shard]
    if (
        len(shard_dims) != 1
        or placements[shard_dims[0]].dim != 0
        or not value.shape
        or not all(type(p) is Replicate for i, p in enumerate(placements) if i != shard_dims[0])
    ):
        return None
    ranks = value.device_mesh.mesh
    where = (ranks == main).nonzero()
    if where.numel() == 0:
        raise CheckpointConfigError(f"rank {main} is not in the device mesh of a sharded parameter")
    index = list(where[0].tolist())
    index[shard_dims[0]] = slice(None)
    group = ranks[tuple(index)].tolist()
    total, size = value.shape[0], math.ceil(value.shape[0] / len(group))
    return [(g, min(i * size, total), max(0, min(size, total - i * size))) for i, g in enumerate(group)]


def _transfer_device(value: DTensor) -> torch.device:
    """Where the rows travel: the mesh's device (NCCL moves only CUDA tensors, even when FSDP's CPU
    offload keeps the shards in host memory)."""
    kind = value.device_mesh.device_type
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(kind)


def _assemble(value: DTensor, pieces: list[Piece], rank: int, buffers: ReusableBuffer) -> torch.Tensor | None:
    """Point-to-point gather of one ``Shard(0)`` tensor into the main rank's buffer (None elsewhere).

    Ranks outside the main rank's shard group (other HSDP replicas) take no part.
    """
    local, device = value.to_local(), _transfer_device(value)
    if rank != 0:
        if any(g == rank and rows > 0 for g, _, rows in pieces):
            dist.send(local.to(device).contiguous(), dst=0)
        return None
    full = buffers.view(device, value.dtype, tuple(value.shape))
    for g, first, rows in pieces:
        if rows == 0:
            continue
        if g == 0:
            full[first : first + rows].copy_(local)
        else:
            dist.recv(full[first : first + rows], src=g)
    return full


def _gathered(
    plan: SafetensorsPlan,
    state: Mapping[str, torch.Tensor],
    buffers: ReusableBuffer,
) -> Iterator[tuple[str, torch.Tensor | None]]:
    """Each planned tensor in plan order, whole on the main rank (None elsewhere).

    Collective: the transfers of one tensor happen when it is drawn, so every rank must draw every
    tensor, whatever it does with them. A whole tensor is a view of ``buffers``, valid until the
    next is drawn.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    for slot in plan.slots:  # the same order on every rank
        value = state[slot.name]
        if isinstance(value, DTensor):
            pieces = row_pieces(value)
            full = value.full_tensor() if pieces is None else _assemble(value, pieces, rank, buffers)
        else:
            full = value
        yield slot.name, full


def write_gathered(
    path: Path | None, state: Mapping[str, torch.Tensor], *, aliases: Mapping[str, str], is_main: bool
) -> int:
    """Collective: every rank calls it with the same ``state`` keys; ``path`` matters on the main rank.

    Returns the bytes written (0 elsewhere). If writing failed, raises on the main rank only, and
    only after every transfer was done: the caller must still join its later collectives.
    """
    plan = plan_for(state, aliases)
    writer: SafetensorsStreamWriter | None = None
    error: Exception | None = None
    if is_main:
        try:
            writer = SafetensorsStreamWriter(path, plan)
        except Exception as exc:  # noqa: BLE001 - raised after the transfers below
            error = exc
    largest = max((slot.nbytes for slot in plan.slots), default=0)
    buffers, staging = ReusableBuffer(largest), ReusableBuffer(largest)
    written = 0
    for name, full in _gathered(plan, state, buffers):
        if full is None or writer is None or error is not None:
            continue
        try:
            if full.device.type != "cpu":
                full = staging.view("cpu", full.dtype, tuple(full.shape)).copy_(full)
            written += writer.write(name, full.detach())
        except Exception as exc:  # noqa: BLE001
            error = exc
        del full
    if writer is not None:
        if error is None:
            try:
                writer.close()
            except Exception as exc:  # noqa: BLE001
                error = exc
        else:
            writer.abort()
    if error is not None:
        raise error
    return written


def gather_to_cpu(
    state: Mapping[str, torch.Tensor],
    *,
    aliases: Mapping[str, str],
    is_main: bool,
) -> tuple[SafetensorsPlan, dict[str, torch.Tensor] | None]:
    """Collective, like :func:`write_gathered`, but the main rank keeps every whole tensor in fresh
    CPU memory (returned with the file's plan; None elsewhere) instead of streaming it to a file.

    An asynchronous save's snapshot of a sharded model: the transfers must happen on the training
    thread at the save step, the file is written later by :func:`write_planned`. The main rank then
    holds the whole model once in CPU memory, the price of not stalling on the write. A failure
    on the main rank is raised after every transfer, as in :func:`write_gathered`.
    """
    plan = plan_for(state, aliases)
    largest = max((slot.nbytes for slot in plan.slots), default=0)
    buffers = ReusableBuffer(largest)
    out: dict[str, torch.Tensor] | None = {} if is_main else None
    error: Exception | None = None
    for name, full in _gathered(plan, state, buffers):
        if full is None or out is None or error is not None:
            continue
        try:
            out[name] = copy_tensor(full)
        except Exception as exc:  # noqa: BLE001 - raised after the transfers
            error = exc
        del full
    if error is not None:
        raise error
    return plan, out


def write_planned(path: Path, plan: SafetensorsPlan, tensors: Mapping[str, torch.Tensor]) -> int:
    """Write tensors gathered by :func:`gather_to_cpu` with the same stream writer and plan as
    :func:`write_gathered`, so the file is byte-identical to a synchronous save's."""
    writer = SafetensorsStreamWriter(path, plan)
    written = 0
    try:
        for slot in plan.slots:
            written += writer.write(slot.name, tensors[slot.name])
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return written
