"""Resume: read a checkpoint completely, check it against the live objects, then apply it.

All-or-nothing by construction: every file is located, read and validated (weights against the
model, optimizer state against its param groups, JSON states against their objects) before the
first ``load_state_dict``. So any :class:`CheckpointError` leaves the model, optimizer, scheduler,
scaler and RNGs exactly as they were. Loading needs no collective in non-sharded runs: each rank
reads the same files and restores its own RNG state.

A sharded model (DTensor parameters) or a checkpoint whose weights/optimizer are DCP shards goes
through :mod:`lerobot_ckpt.sharded_load` (FQN-keyed, resharding onto the current topology). For a
sharded model that path is collective: the checks' outcome is agreed first, so a problem seen by
one rank is raised on all of them before any rank enters a DCP read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from attrs import define
from torch import nn

from lerobot_ckpt import jsonstate, rng_state
from lerobot_ckpt.collective import Collective, describe
from lerobot_ckpt.discovery import resolve_checkpoint_dir
from lerobot_ckpt.dstate import AdapterState, is_sharded_model
from lerobot_ckpt.errors import (
    CheckpointConfigError,
    CheckpointError,
    CorruptCheckpointError,
    MissingCheckpointFileError,
    StateMismatchError,
)
from lerobot_ckpt.layout import CheckpointPaths
from lerobot_ckpt.model_state import apply_weights, few, read_checked_weights
from lerobot_ckpt.optimizer_state import apply_optimizer, read_optimizer
from lerobot_ckpt.record import TrainingStepRecord, read_record
from lerobot_ckpt.sharded_load import prepare_state
from lerobot_ckpt.tensorfile import read_tensors

ApplyAdapter = Callable[[dict[str, torch.Tensor]], None]


@define(frozen=True)
class ResumeState:
    """What a resumed trainer needs besides the restored objects."""

    checkpoint_dir: Path
    record: TrainingStepRecord
    rng_restored: bool  # False when the checkpoint has no state for this rank (it ran on fewer ranks)
    scaler_restored: bool  # False when the saved run was not fp16 (the scaler starts fresh)

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


def read_training_step(checkpoint: Path | str) -> TrainingStepRecord:
    """The record of the checkpoint a user path names (see ``resolve_checkpoint_dir``); torch-free."""
    return read_record(CheckpointPaths(resolve_checkpoint_dir(checkpoint)))


def _enabled(scaler: Any) -> bool:
    return scaler is not None and bool(getattr(scaler, "is_enabled", lambda: True)())


def _required_files(paths: CheckpointPaths, record: TrainingStepRecord, *, model, apply_adapter, optimizer,
                    scheduler, scaler, restore_rng) -> list[Path]:
    art, files = record.artifacts, []
    if art.peft_adapter:
        if model is not None and apply_adapter is None:
            raise CheckpointConfigError(
                f"{paths.root} holds a PEFT adapter, not full weights: pass apply_adapter= to load it"
            )
        if apply_adapter is not None:
            files.append(paths.adapter_weights)
    elif apply_adapter is not None:
        raise CheckpointConfigError(f"apply_adapter was given but {paths.root} holds no PEFT adapter")
    elif model is not None:
        if art.model_safetensors:
            files.append(paths.model_weights)
        else:
            raise CorruptCheckpointError(paths.training_step, "it records no model weights")
    if optimizer is not None:
        if art.optimizer_single_file:
            files += [paths.optimizer_state, paths.optimizer_param_groups]
        else:
            raise MissingCheckpointFileError(paths.optimizer_state, "the run was saved without optimizer state")
    if scheduler is not None:
        if not art.scheduler:
            raise MissingCheckpointFileError(paths.scheduler_state, "the run was saved without a scheduler")
        files.append(paths.scheduler_state)
    if _enabled(scaler) and (art.scaler or record.mixed_precision == "fp16"):
        files.append(paths.scaler_state)
    if restore_rng:
        files.append(paths.rng_state)
    return files


def _json_state(path: Path, obj: Any, what: str) -> dict[str, Any]:
    """A saved ``state_dict`` typed like ``obj``'s, refused when its public keys differ (another class)."""
    saved = jsonstate.read(path)
    if not isinstance(saved, dict) or not saved:
        raise CorruptCheckpointError(path, f"expected a non-empty JSON object of {what} state")
    current = obj.state_dict()
    def public(keys) -> set[str]:
        return {k for k in keys if not str(k).startswith("_")}

    missing, extra = public(current) - public(saved), public(saved) - public(current)
    if missing or extra:
        raise StateMismatchError(
            f"{path} does not match this {type(obj).__name__}: "
            + "; ".join(p for p in (missing and f"missing {few(missing)}", extra and f"unknown {few(extra)}") if p)
        )
    return jsonstate.like(saved, current)


def _uses_distributed_path(record: TrainingStepRecord, *, model, optimizer, apply_adapter, adapter_state) -> bool:
    art = record.artifacts
    wants_weights = model is not None or apply_adapter is not None
    return (
        (model is not None and is_sharded_model(model))
        or adapter_state is not None
        or (wants_weights and art.model_dcp)
        or (optimizer is not None and art.optimizer_dcp and not art.optimizer_single_file)
    )


def _read_rng(paths: CheckpointPaths, rank: int) -> dict[str, torch.Tensor] | None:
    flat = read_tensors(paths.rng_state)[0]
    rng = rng_state.unpack(flat, rank)
    if rng is None and rank == 0:
        raise CorruptCheckpointError(paths.rng_state, f"missing entries among {', '.join(rng_state.REQUIRED)}")
    return rng


def load_checkpoint(
    checkpoint: Path | str,
    *,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    scaler: Any | None = None,
    apply_adapter: ApplyAdapter | None = None,
    adapter_state: AdapterState | None = None,
    restore_rng: bool = True,
    rank: int | None = None,
) -> ResumeState:
    """Restore what is passed from ``checkpoint`` (any path ``resolve_checkpoint_dir`` accepts).

    Call it after building model, optimizer, scheduler and data pipeline: RNG states are restored
    last, so construction does not consume the resumed random streams. ``rank`` defaults to this
    process's rank in ``torch.distributed`` (0 without a process group).

    Any topology loads any checkpoint: ``model`` may be plain, DDP-wrapped or ``fully_shard``-ed
    (then every rank must call this, it is collective); weights come from DCP shards when the
    checkpoint has them, else from ``model.safetensors``, and the optimizer from ``optimizer_0/`` or
    ``optimizer_state.safetensors``, resharded onto the current layout. PEFT checkpoints: pass the
    same ``adapter_state`` as to ``save_checkpoint`` (any topology), or ``apply_adapter`` (receives
    the adapter's full tensors; non-sharded models only).
    """
    paths = CheckpointPaths(resolve_checkpoint_dir(checkpoint))
    record = read_record(paths)
    comm = Collective.current()
    rank = comm.rank if rank is None else rank
    if not _uses_distributed_path(record, model=model, optimizer=optimizer, apply_adapter=apply_adapter,
                                  adapter_state=adapter_state):
        return _load_single(paths, record, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                            apply_adapter=apply_adapter, restore_rng=restore_rng, rank=rank)

    collective = model is not None and is_sharded_model(model)
    error: CheckpointError | None = None
    try:
        files = _required_files(paths, record, model=None, apply_adapter=None, optimizer=None, scheduler=scheduler,
                                scaler=scaler, restore_rng=restore_rng)
        missing = [p for p in files if not p.is_file()]
        if missing:
            raise MissingCheckpointFileError(missing[0])
        prepared = prepare_state(paths, record, model=model, optimizer=optimizer, adapter_state=adapter_state,
                                 apply_adapter=apply_adapter, collective=collective)
        sched_sd = _json_state(paths.scheduler_state, scheduler, "scheduler") if scheduler is not None else None
        scaler_sd = _json_state(paths.scaler_state, scaler, "scaler") if paths.scaler_state in files else None
        rng = _read_rng(paths, rank) if restore_rng else None
    except CheckpointError as exc:
        error = exc
    except Exception as exc:  # noqa: BLE001 - peers must hear of it before they enter a collective read
        error = CheckpointError(f"rank {rank}: could not prepare the resume from {paths.root}: {describe(exc)}")
        error.__cause__ = exc
    if collective:
        comm.agree(error)
    elif error is not None:
        raise error

    prepared.apply()
    return _restore_rest(paths, record, scheduler, sched_sd, scaler, scaler_sd, rng)


def _load_single(paths: CheckpointPaths, record: TrainingStepRecord, *, model, optimizer, scheduler, scaler,
                 apply_adapter, restore_rng: bool, rank: int) -> ResumeState:
    """Non-sharded model from a checkpoint without DCP artifacts: whole files, no collective."""
    files = _required_files(paths, record, model=model, apply_adapter=apply_adapter, optimizer=optimizer,
                            scheduler=scheduler, scaler=scaler, restore_rng=restore_rng)
    missing = [p for p in files if not p.is_file()]
    if missing:
        others = f"also missing: {', '.join(p.name for p in missing[1:])}" if len(missing) > 1 else ""
        raise MissingCheckpointFileError(missing[0], others)

    weights = read_checked_weights(paths.model_weights, model) if paths.model_weights in files else None
    adapter = read_tensors(paths.adapter_weights)[0] if paths.adapter_weights in files else None
    optim_sd = read_optimizer(paths, optimizer) if optimizer is not None else None
    sched_sd = _json_state(paths.scheduler_state, scheduler, "scheduler") if scheduler is not None else None
    scaler_sd = _json_state(paths.scaler_state, scaler, "scaler") if paths.scaler_state in files else None
    rng = _read_rng(paths, rank) if restore_rng else None

    if adapter is not None:  # first: the caller's code is the one step that may still refuse
        apply_adapter(adapter)
    if weights is not None:
        apply_weights(model, weights)
    if optim_sd is not None:
        apply_optimizer(optimizer, optim_sd)
    return _restore_rest(paths, record, scheduler, sched_sd, scaler, scaler_sd, rng)


def _restore_rest(paths: CheckpointPaths, record: TrainingStepRecord, scheduler, sched_sd, scaler, scaler_sd,
                  rng) -> ResumeState:
    """The states every load path restores last, RNG at the very end (nothing may draw after it)."""
    if sched_sd is not None:
        scheduler.load_state_dict(sched_sd)
    if scaler_sd is not None:
        scaler.load_state_dict(scaler_sd)
    if rng is not None:
        rng_state.restore(rng)
    return ResumeState(checkpoint_dir=paths.root, record=record, rng_restored=rng is not None,
                       scaler_restored=scaler_sd is not None)
