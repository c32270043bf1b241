"""Resume: read a checkpoint completely, check it against the live objects, then apply it.

All-or-nothing by construction: every file is located, read and validated (weights against the
model, optimizer state against its param groups, JSON states against their objects) before the
first ``load_state_dict``. So any :class:`CheckpointError` leaves the model, optimizer, scheduler,
scaler and RNGs exactly as they were. Loading needs no collective in non-sharded runs: each rank
reads the same files and restores its own RNG state.

A sharded model (DTensor parameters) or a checkpoint whose weights/optimizer are DCP shards goes
through :mod:`lerobot_ckpt._reshard` (FQN-keyed, resharding onto the current topology). For a
sharded model that path is collective: the checks' outcome is agreed first, so a problem seen by
one rank is raised on all of them before any rank enters a DCP read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from attrs import define, field
from attrs.validators import instance_of

from lerobot_ckpt._collective import Collective, describe
from lerobot_ckpt._reshard import ema_step, prepare_state
from lerobot_ckpt.discovery import resolve_checkpoint_dir
from lerobot_ckpt.errors import (
    CheckpointConfigError,
    CheckpointError,
    CorruptCheckpointError,
    MissingCheckpointFileError,
)
from lerobot_ckpt.layout import CheckpointPaths
from lerobot_ckpt.objects import TrainingObjects
from lerobot_ckpt.safetensors.files import read_tensors
from lerobot_ckpt.state import rng as rng_state
from lerobot_ckpt.state.fqn import AdapterState, is_sharded_model
from lerobot_ckpt.state.model import apply_weights, read_checked_weights
from lerobot_ckpt.state.optimizer import apply_optimizer, read_optimizer
from lerobot_ckpt.state.record import TrainingStepRecord, read_record
from lerobot_ckpt.state.scheduler_scaler import read_state, scaler_enabled

ApplyAdapter = Callable[[dict[str, torch.Tensor]], None]


@define(frozen=True)
class ResumeState:
    """What a resumed trainer needs besides the restored objects."""

    checkpoint_dir: Path
    record: TrainingStepRecord
    rng_restored: bool  # False when the checkpoint has no state for this rank (it ran on fewer ranks)
    scaler_restored: bool  # False when the saved run was not fp16 (the scaler starts fresh)
    # False when an EMA shadow was passed but the checkpoint has none (the shadow keeps its start values)
    ema_restored: bool = False

    @property
    def step(self) -> int:
        return self.record.step

    @property
    def sampler_state(self) -> dict[str, Any]:
        return self.record.sampler

    @property
    def loop_state(self) -> dict[str, Any]:
        """The trainer's own counters as saved (``save_checkpoint(loop_state=...)``); {} when none were."""
        return self.record.loop


@define(frozen=True, kw_only=True, eq=False)
class LoadRequest:
    """What one :func:`load_checkpoint` call restores, and into what; it travels as one value."""

    objects: TrainingObjects = field(validator=instance_of(TrainingObjects))
    apply_adapter: ApplyAdapter | None = None
    adapter_state: AdapterState | None = None
    restore_rng: bool = True
    rank: int = 0

    def reads_shards(self, record: TrainingStepRecord) -> bool:
        """True when model or optimizer go through :mod:`lerobot_ckpt._reshard` (FQN-keyed, resharding)."""
        art, model, optimizer = record.artifacts, self.objects.model, self.objects.optimizer
        wants_weights = model is not None or self.apply_adapter is not None
        return (
            (model is not None and is_sharded_model(model))
            or self.adapter_state is not None
            or (wants_weights and art.model_dcp)
            or (optimizer is not None and art.optimizer_dcp and not art.optimizer_single_file)
            or (self.objects.ema is not None and art.ema_dcp)
        )


def _weight_and_optimizer_files(
    paths: CheckpointPaths, record: TrainingStepRecord, request: LoadRequest
) -> list[Path]:
    """The whole-file weights and optimizer a non-sharded load reads (the sharded path checks its own)."""
    art, files, objects = record.artifacts, [], request.objects
    if art.peft_adapter:
        if objects.model is not None and request.apply_adapter is None:
            raise CheckpointConfigError(
                f"{paths.root} holds a PEFT adapter, not full weights: pass apply_adapter= to load it"
            )
        if request.apply_adapter is not None:
            files.append(paths.adapter_weights)
    elif request.apply_adapter is not None:
        raise CheckpointConfigError(f"apply_adapter was given but {paths.root} holds no PEFT adapter")
    elif objects.model is not None:
        if art.model_safetensors:
            files.append(paths.model_weights)
        else:
            raise CorruptCheckpointError(paths.training_step, "it records no model weights")
    if objects.optimizer is not None:
        if art.optimizer_single_file:
            files += [paths.optimizer_state, paths.optimizer_param_groups]
        else:
            raise MissingCheckpointFileError(
                paths.optimizer_state, "the run was saved without optimizer state"
            )
    return files


def _state_files(paths: CheckpointPaths, record: TrainingStepRecord, request: LoadRequest) -> list[Path]:
    """Scheduler, scaler and RNG files, which every load path reads whole."""
    files, objects = [], request.objects
    if objects.scheduler is not None:
        if not record.artifacts.scheduler:
            raise MissingCheckpointFileError(paths.scheduler_state, "the run was saved without a scheduler")
        files.append(paths.scheduler_state)
    if scaler_enabled(objects.scaler) and (record.artifacts.scaler or record.mixed_precision == "fp16"):
        files.append(paths.scaler_state)
    if request.restore_rng:
        files.append(paths.rng_state)
    return files


def _present(files: list[Path]) -> list[Path]:
    """``files``, once each one is checked to exist; the error names the first missing and lists the rest."""
    missing = [p for p in files if not p.is_file()]
    if missing:
        others = f"also missing: {', '.join(p.name for p in missing[1:])}" if len(missing) > 1 else ""
        raise MissingCheckpointFileError(missing[0], others)
    return files


def _read_rng(paths: CheckpointPaths, rank: int) -> dict[str, torch.Tensor] | None:
    flat = read_tensors(paths.rng_state)[0]
    rng = rng_state.unpack(flat, rank)
    if rng is None and rank == 0:
        raise CorruptCheckpointError(
            paths.rng_state, f"missing entries among {', '.join(rng_state.REQUIRED)}"
        )
    return None if rng is None else rng_state.check(paths.rng_state, rng, rank)


@define(frozen=True, eq=False)
class _States:
    """Scheduler, scaler and RNG state, read and checked; :meth:`restore` applies them last."""

    scheduler: dict[str, Any] | None
    scaler: dict[str, Any] | None
    rng: dict[str, torch.Tensor] | None

    @classmethod
    def read(cls, paths: CheckpointPaths, files: list[Path], request: LoadRequest) -> _States:
        scheduler, scaler = request.objects.scheduler, request.objects.scaler
        scheduler = None if scheduler is None else read_state(paths.scheduler_state, scheduler, "scheduler")
        scaler = read_state(paths.scaler_state, scaler, "scaler") if paths.scaler_state in files else None
        return cls(scheduler, scaler, _read_rng(paths, request.rank) if request.restore_rng else None)

    def restore(
        self, paths: CheckpointPaths, record: TrainingStepRecord, request: LoadRequest
    ) -> ResumeState:
        """RNG at the very end: nothing may draw after it."""
        if self.scheduler is not None:
            request.objects.scheduler.load_state_dict(self.scheduler)
        if self.scaler is not None:
            request.objects.scaler.load_state_dict(self.scaler)
        if self.rng is not None:
            rng_state.restore(self.rng)
        return ResumeState(
            checkpoint_dir=paths.root,
            record=record,
            rng_restored=self.rng is not None,
            scaler_restored=self.scaler is not None,
            ema_restored=request.objects.ema is not None and record.artifacts.ema,
        )


def load_checkpoint(
    checkpoint: Path | str,
    *,
    objects: TrainingObjects,
    apply_adapter: ApplyAdapter | None = None,
    adapter_state: AdapterState | None = None,
    restore_rng: bool = True,
    rank: int | None = None,
) -> ResumeState:
    """Restore ``objects`` (:class:`TrainingObjects`; those given) from ``checkpoint`` (any path
    ``resolve_checkpoint_dir`` accepts).

    Call it after building model, optimizer, scheduler and data pipeline: RNG states are restored
    last, so construction does not consume the resumed random streams. ``rank`` defaults to this
    process's rank in ``torch.distributed`` (0 without a process group).

    Any topology loads any checkpoint: ``objects.model`` (an ``nn.Module``) may be plain, DDP-wrapped
    or ``fully_shard``-ed (then every rank must call this, it is collective); weights come from DCP
    shards when the checkpoint has them, else from ``model.safetensors``, and the optimizer from
    ``optimizer_0/`` or ``optimizer_state.safetensors``, resharded onto the current layout. PEFT
    checkpoints: pass the same ``adapter_state`` as to ``save_checkpoint`` (any topology), or
    ``apply_adapter`` (receives the adapter's full tensors; non-sharded models only).
    """
    paths = CheckpointPaths(resolve_checkpoint_dir(checkpoint))
    record = read_record(paths)
    comm = Collective.current()
    request = LoadRequest(
        objects=objects,
        apply_adapter=apply_adapter,
        adapter_state=adapter_state,
        restore_rng=restore_rng,
        rank=comm.rank if rank is None else rank,
    )
    if not request.reads_shards(record):
        return _load_whole_files(paths, record, request)
    return _load_resharded(paths, record, request, comm)


def _load_resharded(
    paths: CheckpointPaths, record: TrainingStepRecord, request: LoadRequest, comm: Collective
) -> ResumeState:
    """Model and optimizer through :mod:`lerobot_ckpt._reshard`; collective for a sharded model,
    whose ranks agree on the checks' outcome before any of them enters a DCP read."""
    model = request.objects.model
    collective = model is not None and is_sharded_model(model)
    error: CheckpointError | None = None
    try:
        files = _present(_state_files(paths, record, request))
        prepared = prepare_state(
            paths,
            record,
            model=model,
            optimizer=request.objects.optimizer,
            adapter_state=request.adapter_state,
            apply_adapter=request.apply_adapter,
            collective=collective,
            ema=request.objects.ema,
        )
        states = _States.read(paths, files, request)
    except CheckpointError as exc:
        error = exc
    except Exception as exc:  # noqa: BLE001 - peers must hear of it before they enter a collective read
        error = CheckpointError(
            f"rank {request.rank}: could not prepare the resume from {paths.root}: {describe(exc)}"
        )
        error.__cause__ = exc
    if collective:
        comm.agree(error)
    elif error is not None:
        raise error

    prepared.apply()
    return states.restore(paths, record, request)


def _load_whole_files(
    paths: CheckpointPaths, record: TrainingStepRecord, request: LoadRequest
) -> ResumeState:
    """Non-sharded model from a checkpoint without DCP artifacts: whole files, no collective."""
    files = _present(
        _weight_and_optimizer_files(paths, record, request) + _state_files(paths, record, request)
    )
    model, optimizer = request.objects.model, request.objects.optimizer
    weights = read_checked_weights(paths.model_weights, model) if paths.model_weights in files else None
    adapter = read_tensors(paths.adapter_weights)[0] if paths.adapter_weights in files else None
    optim_sd = read_optimizer(paths, optimizer) if optimizer is not None else None
    shadow = ema_step(
        paths,
        record,
        model=model,
        ema=request.objects.ema,
        adapter_state=request.adapter_state,
        collective=False,
    )
    states = _States.read(paths, files, request)

    if adapter is not None:  # first: the caller's code is the one step that may still refuse
        request.apply_adapter(adapter)
    if weights is not None:
        apply_weights(model, weights)
    if optim_sd is not None:
        apply_optimizer(optimizer, optim_sd)
    if shadow is not None:
        shadow()
    return states.restore(paths, record, request)
