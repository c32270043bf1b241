"""The save transaction: every rank calls :func:`save_checkpoint`, the ranks agree, once per save.

One sequence, whatever the topology:

1. **gather** what every rank must contribute: its RNG state (ranks are seeded apart), all-gathered;
2. **stage** (main rank): ``checkpoints/.tmp-<step>-<pid>/`` and the caller's ``write_pretrained``;
3. **writers** (:mod:`lerobot_ckpt._writers`): *collective* ones on every rank, after the staging
   path is broadcast and agreed, with a second agreement after them (a sharded run: DCP shards, the
   tensor-by-tensor gather); then the main rank's own (a non-sharded run: weights and optimizer);
4. **finish** (main rank): RNG, scheduler and scaler state, ``training_step.json``;
5. **commit** (main rank): fsync, rename, swap ``last``;
6. **agree**: an all-reduce of an error flag, which is also the barrier.

A non-sharded run is the case with no collective writers: its only collectives are the gather and
the final agreement. A failure anywhere is raised on every rank with the same message, after the
main rank removed the staging tree, never a hang; until the rename nothing visible changed, so the
previous checkpoint and ``last`` stay valid.

This is the one transaction the next features plug into, not a second save path. An asynchronous
save (:mod:`lerobot_ckpt.async_save`, :meth:`_Transaction.start`) runs phases 1-2 and each
writer's *snapshot* (CPU copies, the gather of a sharded model) on the training thread, then
phases 3-6 on a background thread over a checkpoint group of its own: the same writers' files,
the same crash-safe commit, and the commit only after the agreement that every rank's writers
finished. An EMA shadow is one more state, i.e. one more writer (collective when the model is
sharded).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import safetensors
import torch
from attrs import define, field
from attrs.validators import instance_of
from torch import nn

from lerobot_ckpt._collective import Collective, describe
from lerobot_ckpt._snapshot import FrozenState, snapshot
from lerobot_ckpt._writers import InEma, ShardedState, WholeOptimizer, WholeWeights, Writer, writing
from lerobot_ckpt.commit.staging import StagedCheckpoint
from lerobot_ckpt.errors import CheckpointConfigError, CheckpointSaveError, CheckpointWriteError
from lerobot_ckpt.layout import CheckpointPaths, checkpoints_dir, step_dir_name
from lerobot_ckpt.objects import TrainingObjects
from lerobot_ckpt.safetensors.files import write_tensors
from lerobot_ckpt.state import rng as rng_state
from lerobot_ckpt.state.fqn import AdapterState, is_sharded_model
from lerobot_ckpt.state.record import Artifacts, RunInfo, TrainingStepRecord, own_version, write_record
from lerobot_ckpt.state.scheduler_scaler import scaler_enabled, write_state

WritePretrained = Callable[[Path], None]
T = TypeVar("T")


@define(frozen=True, kw_only=True, eq=False)
class SaveRequest:
    """What one :func:`save_checkpoint` call asks for; it travels through the transaction as one value."""

    run: RunInfo
    step: int
    objects: TrainingObjects = field(validator=instance_of(TrainingObjects))
    sampler_state: Mapping[str, Any] | None = None
    loop_state: Mapping[str, Any] | None = None
    write_pretrained: WritePretrained | None = None
    adapter_state: AdapterState | None = None

    @property
    def scaler_enabled(self) -> bool:
        return scaler_enabled(self.objects.scaler)

    def validate(self, comm: Collective) -> None:
        """Checks every rank makes identically, so a refusal needs no collective to be unanimous."""
        run, model = self.run, self.objects.model
        step_dir_name(self.step)  # validates step
        if comm.distributed and run.world_size != comm.world_size:
            raise CheckpointConfigError(
                f"run.world_size={run.world_size} but torch.distributed has {comm.world_size} processes"
            )
        if model is not None and not isinstance(model, nn.Module | Mapping):
            raise CheckpointConfigError(
                f"model must be an nn.Module or a state dict, got {type(model).__name__}"
            )
        sharded_model = isinstance(model, nn.Module) and is_sharded_model(model)
        if run.parallelism.is_sharded:
            if not comm.distributed:
                raise CheckpointConfigError(
                    f"dp_shard={run.parallelism.dp_shard}: a sharded (FSDP/HSDP) save is collective and "
                    "needs torch.distributed initialised on every rank; it is not"
                )
            if not sharded_model:
                raise CheckpointConfigError(
                    f"dp_shard={run.parallelism.dp_shard} but the model has no DTensor parameters: pass the "
                    "module sharded with fully_shard (FSDP2/HSDP), not a state dict or an unsharded copy"
                )
        elif sharded_model:
            raise CheckpointConfigError(
                "the model is sharded (DTensor parameters) but run.parallelism has dp_shard=1: pass the "
                "run's resolved Parallelism(dp_replicate, dp_shard)"
            )
        if self.adapter_state is not None and not isinstance(model, nn.Module):
            raise CheckpointConfigError(
                "adapter_state= needs the model (an nn.Module) to take the adapter from"
            )
        if self.objects.ema is not None and model is None:
            raise CheckpointConfigError(
                "an EMA shadow (objects.ema) is saved as the model's state with the shadow in "
                "place of the live weights: pass the model too"
            )
        if run.mixed_precision == "fp16" and not self.scaler_enabled:
            raise CheckpointConfigError(
                "mixed_precision=fp16 needs its loss scaler: pass scaler= (an enabled GradScaler)"
            )
        if run.mixed_precision != "fp16" and self.scaler_enabled:
            raise CheckpointConfigError(
                f"an enabled loss scaler was passed but mixed_precision={run.mixed_precision}; "
                "scaler_state.json is written for fp16 runs only"
            )
        # A trial record, so a sampler_state or loop_state that JSON cannot hold fails here on every rank.
        TrainingStepRecord.for_run(
            run,
            step=0,
            artifacts=Artifacts(),
            sampler=dict(self.sampler_state or {}),
            versions={},
            loop=dict(self.loop_state or {}),
        )

    def writers(self) -> tuple[Writer, ...]:
        """What this save writes between staging and finishing (see :mod:`lerobot_ckpt._writers`)."""
        model, optimizer, ema = self.objects.model, self.objects.optimizer, self.objects.ema
        fmt = self.run.checkpoint_format
        if self.run.parallelism.is_sharded:
            ema_writer = (
                ()
                if ema is None
                else (
                    InEma(
                        ShardedState(self.run, model, None, self.adapter_state, override=ema),
                        Artifacts(ema_safetensors=fmt.writes_safetensors, ema_dcp=fmt.writes_dcp),
                    ),
                )
            )
            return (ShardedState(self.run, model, optimizer, self.adapter_state), *ema_writer)
        whole_optimizer = () if optimizer is None else (WholeOptimizer(optimizer),)
        ema_writer = (
            ()
            if ema is None
            else (
                InEma(WholeWeights(model, self.adapter_state, override=ema), Artifacts(ema_safetensors=True)),
            )
        )
        return (WholeWeights(model, self.adapter_state), *whole_optimizer, *ema_writer)

    def frozen(self) -> SaveRequest:
        """This request as the background phase of an asynchronous save needs it, taken now: the
        scheduler's and scaler's state and the sampler/loop state copied (the live objects move
        on); model, optimizer and callbacks dropped (the snapshot writers hold their part)."""
        objects = self.objects
        frozen = TrainingObjects(  # ema too is dropped: its snapshot writers hold its copy
            scheduler=None if objects.scheduler is None else FrozenState(objects.scheduler),
            scaler=None if objects.scaler is None else FrozenState(objects.scaler),
        )
        return attrs.evolve(
            self,
            objects=frozen,
            sampler_state=snapshot(self.sampler_state),
            loop_state=snapshot(self.loop_state),
            write_pretrained=None,
            adapter_state=None,
        )

    def record(self, artifacts: Artifacts) -> TrainingStepRecord:
        """``training_step.json`` for what the writers wrote."""
        artifacts = attrs.evolve(
            artifacts, scheduler=self.objects.scheduler is not None, scaler=self.scaler_enabled
        )
        versions = {
            **self.run.versions,
            "torch": torch.__version__,
            "safetensors": safetensors.__version__,
            "lerobot-ckpt": own_version(),
        }
        return TrainingStepRecord.for_run(
            self.run,
            step=self.step,
            artifacts=artifacts,
            sampler=self.sampler_state,
            versions=versions,
            loop=self.loop_state,
        )


TEST_COMMIT_DELAY_ENV = "LEROBOT_CKPT_TEST_COMMIT_DELAY_S"


def _test_pause() -> None:
    """Test hook: ``LEROBOT_CKPT_TEST_COMMIT_DELAY_S=<seconds>`` makes the background phase of an
    asynchronous save wait before its writers (then it writes, agrees and commits as usual).

    It only slows the real code path down (a big checkpoint on a slow disk, reproducibly), so a
    test can train while a save is in flight, kill a job while only the staging directory exists,
    and show that the files hold the save step's state although the live objects moved on before
    the writers read anything. Read on every save (a test may set it per rank); unset, 0.
    """
    delay = float(os.environ.get(TEST_COMMIT_DELAY_ENV) or 0)
    if delay > 0:
        time.sleep(delay)


def _as_save_error(exc: Exception, comm: Collective, step: int, committed: bool) -> CheckpointSaveError:
    where = f"rank {getattr(exc, 'rank', comm.rank)}: " if comm.distributed else ""
    name = step_dir_name(step)
    if committed:
        head = f"{where}checkpoint {name} was written but `last` could not be pointed at it: "
    else:
        head = f"{where}checkpoint {name} was not saved (the previous checkpoint and `last` are unchanged): "
    if isinstance(exc, CheckpointWriteError):
        error: CheckpointSaveError = CheckpointWriteError(
            head + str(exc), path=exc.path, os_error=exc.os_error
        )
    elif isinstance(exc, OSError):
        error = CheckpointWriteError(head + describe(exc), path=exc.filename, os_error=exc)
    else:
        error = CheckpointSaveError(head + describe(exc))
    error.__cause__ = exc
    return error


@define
class _Transaction:
    """One save on one rank: the phases of the module docstring, in order (:meth:`run`).

    ``error`` is this rank's first failure; it is never raised alone but joined to the next
    agreement, so every rank keeps calling the same collectives whatever happened locally.
    """

    checkpoints: Path
    request: SaveRequest
    comm: Collective
    staged: StagedCheckpoint | None = field(default=None)  # main rank, once staging began
    staging: Path | None = field(default=None)  # every rank, once shared for collective writers
    error: CheckpointSaveError | None = field(default=None)
    background: bool = field(default=False)  # the background phase of an asynchronous save

    def run(self) -> Path:
        """The synchronous save: every phase on this thread, over the training group."""
        writers = self.request.writers()
        rng_states = self._gather()
        self._stage(rng_states)
        if any(w.collective for w in writers):
            self._share_staging()
        return self._write_and_commit(writers, rng_states)

    def start(self, background: Collective) -> Callable[[], Path]:
        """An asynchronous save's training-thread part; returns the rest, to run on another thread.

        Here, at the save step, over the training group: the RNG gather, staging and
        ``write_pretrained`` (small files), the staging path agreed, and every writer's snapshot
        (CPU copies; the gather of a sharded model). A failure so far is raised now, on every
        rank, before anything runs in the background. The returned callable writes the snapshot,
        finishes and commits exactly as :meth:`run` does, but with ``background`` (the
        checkpoint group) for every collective, so it never meets the training thread's.
        """
        writers = self.request.writers()
        rng_states = self._gather()
        self._stage(rng_states)
        if any(w.collective for w in writers):
            self._share_staging()
        staged: list[Writer] = []
        if self.error is None:
            try:
                for writer in writers:
                    staged.extend(writer.snapshot(self.comm))
            except Exception as exc:  # noqa: BLE001 - joined to the agreement below
                self._fail(exc)
        self._agree_or_abort()
        frozen = attrs.evolve(self, request=self.request.frozen(), comm=background, background=True)
        return lambda: frozen._write_and_commit(staged, rng_states)

    def _share_staging(self) -> None:
        """Collective writers write into the main rank's staging tree: its path on every rank, agreed."""
        staged = self.staged is not None and self.error is None
        staging = self.comm.broadcast_object(str(self.staged.staging) if staged else None)
        self._agree_or_abort()
        if staging is None:  # a rank's RNG capture failed: it reported that above, so this is unreachable
            raise CheckpointSaveError(
                f"checkpoint {step_dir_name(self.request.step)} was not saved: no staging directory"
            )
        self.staging = Path(staging)

    def _write_and_commit(self, writers: list[Writer] | tuple[Writer, ...], rng_states: list[Any]) -> Path:
        if self.background:
            _test_pause()
        shared = self._write_collectively([w for w in writers if w.collective])
        main = [w for w in writers if not w.collective]
        written = self._on_main(lambda paths: self._write(main, paths, shared))
        self._on_main(lambda paths: self._finish(paths, rng_states, written))
        self._on_main(lambda paths: self._commit())
        self.comm.agree(self.error)
        return self.checkpoints / step_dir_name(self.request.step)

    def _fail(self, exc: Exception) -> None:
        """Record this rank's failure for the next agreement (which raises it on every rank)."""
        committed = self.staged is not None and self.staged.renamed
        self.error = _as_save_error(exc, self.comm, self.request.step, committed)

    def _abort(self) -> None:
        """Remove the staging tree (main rank): after a failure nothing may be committed from it."""
        if self.staged is not None:
            self.staged.abort()

    def _gather(self) -> list[Any]:
        """Every rank's RNG state on every rank; a rank whose capture failed contributes None."""
        mine = None
        try:
            mine = rng_state.capture()
        except Exception as exc:  # noqa: BLE001 - joined to the next agreement, never raised alone
            self._fail(exc)
        return self.comm.all_gather_object(mine)

    def _stage(self, rng_states: list[Any]) -> None:
        """The main rank opens the staging tree, unless a rank could not contribute
        (it reports that itself)."""
        if not self.comm.is_main or self.error is not None or any(s is None for s in rng_states):
            return
        try:
            self.staged = StagedCheckpoint.begin(self.checkpoints, self.request.step)
            ema_dir = self.staged.paths.pretrained_model_ema
            if self.request.objects.ema is not None:  # LeRobot's: a second directory, loadable the same way
                ema_dir.mkdir()
            if self.request.write_pretrained is not None:
                self.request.write_pretrained(self.staged.paths.pretrained_model)
                if self.request.objects.ema is not None:
                    self.request.write_pretrained(ema_dir)
        except Exception as exc:  # noqa: BLE001 - peers must hear of any failure, or they hang
            self._fail(exc)
            self._abort()

    def _on_main(self, phase: Callable[[CheckpointPaths], T]) -> T | None:
        """Run one main-rank phase on the staging tree, unless there is none here or a phase failed."""
        if self.staged is None or self.error is not None:
            return None
        try:
            return phase(self.staged.paths)
        except Exception as exc:  # noqa: BLE001 - peers must hear of any failure, or they hang
            self._fail(exc)
            self._abort()
            return None

    def _write_collectively(self, writers: list[Writer]) -> Artifacts:
        """Every rank writes into the main rank's staging tree (shared before), then all agree.

        A writer failing on one rank is only recorded: the other ranks may still be inside a
        collective with it, so the staging tree is removed once all have agreed, not before.
        """
        if not writers:
            return Artifacts()
        artifacts = Artifacts()
        try:
            artifacts = self._write(writers, CheckpointPaths(self.staging), artifacts)
        except Exception as exc:  # noqa: BLE001 - joined to the agreement below
            self._fail(exc)
        self._agree_or_abort()
        return artifacts

    def _agree_or_abort(self) -> None:
        """An agreement that, on failure, removes the staging tree (main rank) before any rank raises."""
        try:
            self.comm.agree(self.error)
        except CheckpointSaveError:
            self._abort()
            self.comm.barrier()  # peers return only once the staging directory is gone
            raise

    def _write(self, writers: list[Writer], paths: CheckpointPaths, artifacts: Artifacts) -> Artifacts:
        for writer in writers:
            artifacts |= writer.write(paths, self.comm)
        return artifacts

    def _finish(self, paths: CheckpointPaths, rng_states: list[Any], artifacts: Artifacts) -> None:
        """The main rank's files after the writers: RNG, scheduler, scaler, then the record."""
        request, objects = self.request, self.request.objects
        with writing(paths.rng_state):
            write_tensors(paths.rng_state, rng_state.pack(rng_states))
        if objects.scheduler is not None:
            with writing(paths.scheduler_state):
                write_state(paths.scheduler_state, objects.scheduler, "scheduler")
        if request.scaler_enabled:
            with writing(paths.scaler_state):
                write_state(paths.scaler_state, objects.scaler, "scaler")
        with writing(paths.training_step):
            write_record(paths.training_step, request.record(artifacts))

    def _commit(self) -> None:
        """Make the staging tree the step directory and point ``last`` at it."""
        self.staged.commit()
        self.staged.finish()


def save_checkpoint(
    output_dir: Path | str,
    step: int,
    *,
    run: RunInfo,
    objects: TrainingObjects,
    sampler_state: Mapping[str, Any] | None = None,
    loop_state: Mapping[str, Any] | None = None,
    write_pretrained: WritePretrained | None = None,
    adapter_state: AdapterState | None = None,
) -> Path:
    """Write ``<output_dir>/checkpoints/<step>/`` and point ``last`` at it; returns the step directory.

    Call it on every rank (it is collective). ``objects`` are what is saved (model, optimizer,
    scheduler, scaler: :class:`TrainingObjects`); ``objects.model`` may be wrapped (DDP,
    torch.compile) or a state dict. ``write_pretrained(pretrained_model_dir)`` runs on the main rank
    only, to add config.json, train_config.json, processor files or a PEFT adapter (non-sharded runs).

    Sharded runs (``run.parallelism.dp_shard > 1``, ``objects.model`` the ``fully_shard``-ed module)
    write the optimizer as DCP shards and the weights per ``run.checkpoint_format``; every rank writes.
    ``adapter_state(state_dict) -> adapter_state_dict`` selects and renames the weights of a PEFT
    run (e.g. ``lambda sd: get_peft_model_state_dict(peft_model, state_dict=sd)``): they are then
    written as ``adapter_model.safetensors`` and/or adapter-only DCP shards. Raises
    :class:`CheckpointWriteError` (disk full, permissions) or :class:`CheckpointSaveError` on every
    rank when any rank failed; the previous checkpoint and ``last`` are then untouched.
    ``loop_state`` is the trainer's own JSON-able counters (step, updates, accumulation position),
    stored in ``training_step.json`` beside ``sampler_state`` and returned by ``ResumeState.loop_state``.
    """
    request = SaveRequest(
        run=run,
        step=step,
        objects=objects,
        sampler_state=sampler_state,
        loop_state=loop_state,
        write_pretrained=write_pretrained,
        adapter_state=adapter_state,
    )
    comm = Collective.current()
    request.validate(comm)
    return _Transaction(checkpoints_dir(output_dir), request, comm).run()
