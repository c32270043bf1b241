"""Collective save: every rank calls :func:`save_checkpoint`, the main rank writes, all agree.

1. every rank captures its RNG state and the states are gathered (ranks are seeded apart);
2. the main rank stages ``checkpoints/.tmp-<step>-<pid>/``, writes the caller's ``pretrained_model``
   files, the weights, optimizer, RNG, scheduler and scaler state and ``training_step.json``, then
   commits (fsync, rename, swap ``last``);
3. one agreement ends the save on every rank: an all-reduce of an error flag, which is also the
   barrier. A failure anywhere is raised on every rank with the same message, never a hang.

Sharded runs (``run.parallelism.dp_shard > 1``) split 2 (see :mod:`lerobot_ckpt.sharded_save`):
after staging, an agreement and a broadcast of the staging path, collective writers on all ranks
(DCP into ``pytorch_model_fsdp_0/`` and ``optimizer_0/``, a tensor-by-tensor gather for
``model.safetensors``), another agreement, then the same commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import safetensors
import torch
from safetensors import SafetensorError
from torch import nn

from lerobot_ckpt import jsonstate, rng_state
from lerobot_ckpt.collective import Collective, describe
from lerobot_ckpt.dstate import AdapterState, is_sharded_model
from lerobot_ckpt.errors import CheckpointConfigError, CheckpointSaveError, CheckpointWriteError
from lerobot_ckpt.layout import CheckpointPaths, checkpoints_dir, step_dir_name
from lerobot_ckpt.model_state import save_model_weights, unwrap_model
from lerobot_ckpt.optimizer_state import save_optimizer
from lerobot_ckpt.record import Artifacts, RunInfo, TrainingStepRecord, package_versions, write_record
from lerobot_ckpt.sharded_save import save_sharded
from lerobot_ckpt.staging import StagedCheckpoint
from lerobot_ckpt.tensorfile import write_tensors

Stateful = Any  # anything with state_dict()/load_state_dict(): LR schedulers, GradScaler
WritePretrained = Callable[[Path], None]


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Name the file in the error: safetensors' own errors do not, and the user needs the path."""
    try:
        yield
    except (OSError, SafetensorError) as exc:
        raise CheckpointWriteError(f"could not write {path}: {describe(exc)}", path=path, os_error=exc) from exc


def _scaler_enabled(scaler: Stateful | None) -> bool:
    return scaler is not None and bool(getattr(scaler, "is_enabled", lambda: True)())


def _validate(run: RunInfo, comm: Collective, model, scaler, sampler_state, loop_state, adapter_state) -> None:
    """Checks every rank makes identically, so a refusal needs no collective to be unanimous."""
    if comm.distributed and run.world_size != comm.world_size:
        raise CheckpointConfigError(
            f"run.world_size={run.world_size} but torch.distributed has {comm.world_size} processes"
        )
    if model is not None and not isinstance(model, nn.Module | Mapping):
        raise CheckpointConfigError(f"model must be an nn.Module or a state dict, got {type(model).__name__}")
    sharded_model = isinstance(model, nn.Module) and is_sharded_model(model)
    if run.parallelism.is_sharded:
        if not comm.distributed:
            raise CheckpointConfigError(
                f"dp_shard={run.parallelism.dp_shard}: a sharded (FSDP/HSDP) save is collective and needs "
                "torch.distributed initialised on every rank; it is not"
            )
        if not sharded_model:
            raise CheckpointConfigError(
                f"dp_shard={run.parallelism.dp_shard} but the model has no DTensor parameters: pass the module "
                "sharded with fully_shard (FSDP2/HSDP), not a state dict or an unsharded copy"
            )
    elif sharded_model:
        raise CheckpointConfigError(
            "the model is sharded (DTensor parameters) but run.parallelism has dp_shard=1: pass the run's "
            "resolved Parallelism(dp_replicate, dp_shard)"
        )
    if adapter_state is not None and not isinstance(model, nn.Module):
        raise CheckpointConfigError("adapter_state= needs the model (an nn.Module) to take the adapter from")
    if run.mixed_precision == "fp16" and not _scaler_enabled(scaler):
        raise CheckpointConfigError("mixed_precision=fp16 needs its loss scaler: pass scaler= (an enabled GradScaler)")
    if run.mixed_precision != "fp16" and _scaler_enabled(scaler):
        raise CheckpointConfigError(
            f"an enabled loss scaler was passed but mixed_precision={run.mixed_precision}; "
            "scaler_state.json is written for fp16 runs only"
        )
    # A trial record, so a sampler_state or loop_state that JSON cannot hold fails here on every rank.
    TrainingStepRecord.for_run(run, step=0, artifacts=Artifacts(), sampler=dict(sampler_state or {}), versions={},
                               loop=dict(loop_state or {}))


def _as_save_error(exc: Exception, comm: Collective, step: int, committed: bool) -> CheckpointSaveError:
    where = f"rank {getattr(exc, 'rank', comm.rank)}: " if comm.distributed else ""
    name = step_dir_name(step)
    if committed:
        head = f"{where}checkpoint {name} was written but `last` could not be pointed at it: "
    else:
        head = f"{where}checkpoint {name} was not saved (the previous checkpoint and `last` are unchanged): "
    if isinstance(exc, CheckpointWriteError):
        error: CheckpointSaveError = CheckpointWriteError(head + str(exc), path=exc.path, os_error=exc.os_error)
    elif isinstance(exc, OSError):
        error = CheckpointWriteError(head + describe(exc), path=exc.filename, os_error=exc)
    else:
        error = CheckpointSaveError(head + describe(exc))
    error.__cause__ = exc
    return error


def _write_rest(paths: CheckpointPaths, *, run: RunInfo, step: int, scheduler, scaler, sampler_state,
                loop_state, rng_states, artifacts: Artifacts) -> None:
    """The main rank's part after the weights and optimizer: RNG, scheduler, scaler, then the record."""
    with _writing(paths.rng_state):
        write_tensors(paths.rng_state, rng_state.pack(rng_states))
    if scheduler is not None:
        with _writing(paths.scheduler_state):
            jsonstate.write(paths.scheduler_state, scheduler.state_dict(), "scheduler")
    if _scaler_enabled(scaler):
        with _writing(paths.scaler_state):
            jsonstate.write(paths.scaler_state, scaler.state_dict(), "scaler")
    artifacts = attrs.evolve(artifacts, scheduler=scheduler is not None, scaler=_scaler_enabled(scaler))
    versions = {**run.versions, "torch": torch.__version__, "safetensors": safetensors.__version__,
                **package_versions()}
    record = TrainingStepRecord.for_run(run, step=step, artifacts=artifacts, sampler=sampler_state,
                                        versions=versions, loop=loop_state)
    with _writing(paths.training_step):
        write_record(paths.training_step, record)


def _write_main(paths: CheckpointPaths, *, run: RunInfo, step: int, model, optimizer, scheduler, scaler,
                sampler_state, loop_state, write_pretrained: WritePretrained | None, rng_states,
                adapter_state: AdapterState | None) -> None:
    """Everything the main rank of a non-sharded run writes into the staging directory."""
    if write_pretrained is not None:
        write_pretrained(paths.pretrained_model)
    if model is not None and adapter_state is not None:
        with _writing(paths.adapter_weights):
            write_tensors(paths.adapter_weights, adapter_state(unwrap_model(model).state_dict()))
    elif model is not None:
        state = unwrap_model(model).state_dict() if isinstance(model, nn.Module) else model
        with _writing(paths.model_weights):
            save_model_weights(paths.model_weights, state)
    if not (paths.model_weights.is_file() or paths.adapter_weights.is_file()):
        raise CheckpointConfigError(
            "the checkpoint would hold no weights: pass model=, or write model.safetensors or a PEFT "
            "adapter (adapter_model.safetensors) from write_pretrained"
        )
    if optimizer is not None:
        with _writing(paths.optimizer_state):
            save_optimizer(paths, optimizer)
    artifacts = Artifacts(model_safetensors=paths.model_weights.is_file(), peft_adapter=paths.adapter_weights.is_file(),
                          optimizer_single_file=optimizer is not None)
    _write_rest(paths, run=run, step=step, scheduler=scheduler, scaler=scaler, sampler_state=sampler_state,
                loop_state=loop_state, rng_states=rng_states, artifacts=artifacts)


def save_checkpoint(
    output_dir: Path | str,
    step: int,
    *,
    run: RunInfo,
    model: nn.Module | Mapping[str, torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Stateful | None = None,
    scaler: Stateful | None = None,
    sampler_state: Mapping[str, Any] | None = None,
    write_pretrained: WritePretrained | None = None,
    adapter_state: AdapterState | None = None,
    loop_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``<output_dir>/checkpoints/<step>/`` and point ``last`` at it; returns the step directory.

    Call it on every rank (it is collective). ``model`` may be wrapped (DDP, torch.compile) or a
    state dict; ``write_pretrained(pretrained_model_dir)`` runs on the main rank only, to add
    config.json, train_config.json, processor files or a PEFT adapter (non-sharded runs).

    Sharded runs (``run.parallelism.dp_shard > 1``, ``model`` the ``fully_shard``-ed module) write
    the optimizer as DCP shards and the weights per ``run.checkpoint_format``; every rank writes.
    ``adapter_state(state_dict) -> adapter_state_dict`` selects and renames the weights of a PEFT
    run (e.g. ``lambda sd: get_peft_model_state_dict(peft_model, state_dict=sd)``): they are then
    written as ``adapter_model.safetensors`` and/or adapter-only DCP shards. Raises
    :class:`CheckpointWriteError` (disk full, permissions) or :class:`CheckpointSaveError` on every
    rank when any rank failed; the previous checkpoint and ``last`` are then untouched.
    ``loop_state`` is the trainer's own JSON-able counters (step, updates, accumulation position),
    stored in ``training_step.json`` beside ``sampler_state`` and returned by ``ResumeState.loop_state``.
    """
    comm = Collective.current()
    step_dir_name(step)  # validates step
    _validate(run, comm, model, scaler, sampler_state, loop_state, adapter_state)
    target = checkpoints_dir(output_dir)
    if run.parallelism.is_sharded:
        def finish_main(paths, rng_states, artifacts):
            _write_rest(paths, run=run, step=step, scheduler=scheduler, scaler=scaler, sampler_state=sampler_state,
                        loop_state=loop_state, rng_states=rng_states, artifacts=artifacts)

        return save_sharded(target, step, run=run, model=model, optimizer=optimizer, scheduler=scheduler,
                            scaler=scaler, sampler_state=sampler_state, write_pretrained=write_pretrained,
                            adapter_state=adapter_state, comm=comm, writing=_writing, finish_main=finish_main,
                            as_error=lambda exc, committed: _as_save_error(exc, comm, step, committed))

    error: CheckpointSaveError | None = None
    try:
        mine = rng_state.capture()
    except Exception as exc:  # noqa: BLE001 - joined to the agreement below, never raised alone
        mine, error = None, _as_save_error(exc, comm, step, committed=False)
    rng_states = comm.all_gather_object(mine)

    staged: StagedCheckpoint | None = None
    # A rank that could not capture its RNG reports that itself; the main rank then writes nothing.
    if comm.is_main and error is None and all(s is not None for s in rng_states):
        try:
            staged = StagedCheckpoint.begin(target, step)
            _write_main(staged.paths, run=run, step=step, model=model, optimizer=optimizer, scheduler=scheduler,
                        scaler=scaler, sampler_state=sampler_state, loop_state=loop_state,
                        write_pretrained=write_pretrained, rng_states=rng_states, adapter_state=adapter_state)
            staged.commit()
            staged.finish()
        except Exception as exc:  # noqa: BLE001 - peers must hear of any failure, or they hang
            error = _as_save_error(exc, comm, step, committed=staged is not None and staged.renamed)
            if staged is not None:
                staged.abort()
    comm.agree(error)
    return target / step_dir_name(step)
