"""Collective save of a sharded (FSDP2/HSDP) run: every rank writes shards into one staging directory.

The non-sharded save has the main rank write everything. Here DCP shards come from all ranks, so
the staging directory must exist, and be known to every rank, before they write:

1. RNG states are gathered (as in every save);
2. the main rank stages ``checkpoints/.tmp-<step>-<pid>/`` and writes the caller's
   ``pretrained_model`` files; the staging path is broadcast; **agreement**;
3. every rank writes: the model as DCP into ``pretrained_model/pytorch_model_fsdp_0/`` and/or as a
   gathered ``model.safetensors`` (per ``checkpoint_format``), the optimizer as DCP into
   ``training_state/optimizer_0/``; **agreement**;
4. the main rank writes RNG/scheduler/scaler state and ``training_step.json`` and commits (fsync,
   rename, swap ``last``); **agreement**.

A failure anywhere is raised on every rank with the same message at the next agreement, and the
main rank removes the staging directory first, so the previous checkpoint and ``last`` stay as they
were. The staging directory must be on a file system all ranks see (as DCP itself requires).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lerobot_ckpt import rng_state
from lerobot_ckpt.collective import Collective
from lerobot_ckpt.dcp_io import MODEL_KEY, OPTIMIZER_KEY, save_dcp
from lerobot_ckpt.dstate import AdapterState, model_state, optimizer_state, tied_aliases
from lerobot_ckpt.errors import CheckpointSaveError
from lerobot_ckpt.gather import write_gathered
from lerobot_ckpt.layout import CheckpointPaths, step_dir_name
from lerobot_ckpt.record import Artifacts, RunInfo
from lerobot_ckpt.staging import StagedCheckpoint

SaveError = Callable[[Exception, bool], CheckpointSaveError]  # (exc, committed) -> error for this rank


def _agree(comm: Collective, error: CheckpointSaveError | None, staged: StagedCheckpoint | None) -> None:
    """An agreement that, on failure, removes the staging tree (main rank) before any rank raises."""
    try:
        comm.agree(error)
    except CheckpointSaveError:
        if staged is not None:
            staged.abort()
        comm.barrier()  # peers return only once the staging directory is gone
        raise


def write_sharded_state(paths: CheckpointPaths, *, run: RunInfo, model: nn.Module,
                        optimizer: torch.optim.Optimizer | None, adapter_state: AdapterState | None,
                        comm: Collective, writing) -> Artifacts:
    """Step 3 on one rank: the collective writers; returns what they wrote.

    DCP fails symmetrically (it raises on every rank when any failed). The gather's write can fail
    on the main rank alone; that error is held until the optimizer's collective save has been
    joined too, so no peer is left waiting in it.
    """
    state = model_state(model, adapter_state)
    fmt = run.checkpoint_format
    weights = paths.adapter_weights if adapter_state is not None else paths.model_weights
    if fmt.writes_dcp:
        save_dcp(paths.model_dcp, MODEL_KEY, state)
    held: Exception | None = None
    if fmt.writes_safetensors:
        aliases = {} if adapter_state is not None else tied_aliases(model, state)
        try:
            with writing(weights):
                write_gathered(weights if comm.is_main else None, state, aliases=aliases, is_main=comm.is_main)
        except Exception as exc:  # noqa: BLE001 - raised below, after the remaining collectives
            held = exc
    del state
    if optimizer is not None:
        try:
            save_dcp(paths.optimizer_dcp, OPTIMIZER_KEY, optimizer_state(model, optimizer))
        except Exception:
            if held is None:
                raise
    if held is not None:
        raise held
    return Artifacts(model_safetensors=fmt.writes_safetensors and adapter_state is None,
                     model_dcp=fmt.writes_dcp, optimizer_dcp=optimizer is not None,
                     peft_adapter=adapter_state is not None)


def save_sharded(target: Path, step: int, *, run: RunInfo, model: nn.Module, optimizer, scheduler, scaler,
                 sampler_state: Mapping[str, Any] | None, write_pretrained, adapter_state: AdapterState | None,
                 comm: Collective, as_error: SaveError, writing, finish_main) -> Path:
    """Steps 1-4 (see the module docstring). ``finish_main(paths, rng_states, artifacts)`` writes the
    main rank's files and the record; ``as_error`` and ``writing`` are the save's error helpers."""
    error: CheckpointSaveError | None = None
    try:
        mine = rng_state.capture()
    except Exception as exc:  # noqa: BLE001 - joined to the agreement below
        mine, error = None, as_error(exc, False)
    rng_states = comm.all_gather_object(mine)

    staged: StagedCheckpoint | None = None
    if comm.is_main and error is None and all(s is not None for s in rng_states):
        try:
            staged = StagedCheckpoint.begin(target, step)
            if write_pretrained is not None:
                write_pretrained(staged.paths.pretrained_model)
        except Exception as exc:  # noqa: BLE001
            error = as_error(exc, False)
    staging = comm.broadcast_object(str(staged.staging) if staged is not None and error is None else None)
    _agree(comm, error, staged)
    if staging is None:  # a rank's RNG capture failed: it reported that above, so this is unreachable
        raise CheckpointSaveError(f"checkpoint {step_dir_name(step)} was not saved: no staging directory")

    paths = CheckpointPaths(staging)
    artifacts = Artifacts()
    try:
        artifacts = write_sharded_state(paths, run=run, model=model, optimizer=optimizer,
                                        adapter_state=adapter_state, comm=comm, writing=writing)
    except Exception as exc:  # noqa: BLE001
        error = as_error(exc, False)
    _agree(comm, error, staged)

    if comm.is_main:
        try:
            finish_main(staged.paths, rng_states, artifacts)
            staged.commit()
            staged.finish()
        except Exception as exc:  # noqa: BLE001
            error = as_error(exc, staged.renamed)
            staged.abort()
    comm.agree(error)
    return target / step_dir_name(step)
