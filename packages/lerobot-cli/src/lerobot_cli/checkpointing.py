"""The CLI's side of checkpoints: what goes into ``pretrained_model/`` and how a run resumes.

``lerobot_ckpt`` owns the layout, the atomic commit and the collective protocol; this module only
supplies the run's own files (policy config, train config, processors) and maps the resumed state
onto the loop, its data position (``loop.position``: the run's data source, or a sampler) and scaler.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
from lerobot_ckpt import (
    AsyncCheckpointer,
    BaseModel,
    CheckpointPaths,
    CorruptCheckpointError,
    Parallelism,
    ResumeState,
    RunInfo,
    StateMismatchError,
    TrainingObjects,
    TrainingStepRecord,
    load_checkpoint,
    package_versions,
    save_checkpoint,
    unwrap_model,
)
from lerobot_ckpt.layout import ADAPTER_CONFIG, POLICY_CONFIG, TRAIN_CONFIG
from lerobot_ckpt.pretrained import stored_float_dtype
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_trainloop.loop import TrainLoop
from lerobot_trainloop.streaming import StreamingDataSource, gather_states
from torch import nn

from lerobot_cli.checkpoint_upload import CheckpointUploader
from lerobot_cli.config import TrainConfig
from lerobot_cli.configio import save_train_config
from lerobot_cli.filewrites import writing
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.serialization import save_policy_config
from lerobot_cli.processors import save_processors
from lerobot_cli.processors.pipeline import ProcessorPipeline
from lerobot_cli.runplan import ResumePlan, ema_changes

log = logging.getLogger(__name__)
_PACKAGES = ("torch", "lerobot-parallel", "lerobot-ckpt", "lerobot-trainloop", "lerobot-cli")


def run_info(cfg: TrainConfig, runtime: ParallelRuntime, base_model: BaseModel | None = None) -> RunInfo:
    p = runtime.parallelism
    return RunInfo(
        world_size=runtime.world_size,
        batch_size=cfg.batch_size,
        grad_accum_steps=cfg.accelerator.gradient_accumulation.steps,
        mixed_precision=cfg.accelerator.mixed_precision,
        parallelism=Parallelism(dp_replicate=p.dp_replicate, dp_shard=p.dp_shard),
        checkpoint_format=cfg.checkpoint_format,
        versions=package_versions(*_PACKAGES),
        base_model=base_model,
    )


def peft_model_of(model: nn.Module):
    """The ``peft.PeftModel`` under any wrapper, or None (peft is only imported by PEFT runs)."""
    peft = sys.modules.get("peft")
    inner = unwrap_model(model)
    return inner if peft is not None and isinstance(inner, peft.PeftModel) else None


def pretrained_writer(
    cfg: TrainConfig,
    policy_cfg: PolicyConfig,
    pre: ProcessorPipeline,
    post: ProcessorPipeline,
    policy: nn.Module | None = None,
) -> Callable[[Path], None]:
    """Files of ``pretrained_model/`` besides the weights, written by the main rank while staging
    (a PEFT run adds ``adapter_config.json``, which names the base policy)."""
    peft_model = peft_model_of(policy) if policy is not None else None
    if peft_model is not None:  # LeRobot's make_policy loads base + adapter when config.json says so
        policy_cfg = attrs.evolve(policy_cfg, use_peft=True)

    def write(directory: Path) -> None:
        # each write names its file when the disk refuses it (the processors name theirs themselves)
        with writing(directory / POLICY_CONFIG):
            save_policy_config(policy_cfg, directory)
        with writing(directory / TRAIN_CONFIG):
            save_train_config(cfg, directory)
        save_processors(pre, post, directory)
        if peft_model is not None:
            from lerobot_cli.peft.adapters import save_adapter_config

            with writing(directory / ADAPTER_CONFIG):
                save_adapter_config(peft_model, directory)

    return write


def _training_objects(loop: TrainLoop) -> TrainingObjects:
    """What a checkpoint of this loop saves and its resume restores: the same objects (the EMA shadow
    too, when the run keeps one)."""
    return TrainingObjects(
        model=loop.model,
        optimizer=loop.optimizer,
        scheduler=loop.scheduler,
        scaler=loop.precision.scaler,
        ema=None if loop.ema is None else loop.ema.state(),
    )


def _adapter_state(model: nn.Module):
    peft_model = peft_model_of(model)
    if peft_model is None:
        return None
    from lerobot_cli.peft.adapters import adapter_state

    return adapter_state(peft_model)


def _random_state_in_lockstep(restored: bool, rank: int) -> None:
    """Every rank continues with the random state rank 0 restored (collective).

    lerobot-train seeds every rank alike and the ranks draw in lockstep, so each sample's draws (pi0's flow
    noise and time, diffusion's noise and timestep) follow its dataset index whatever rank it lands on, and
    the layouts of one global batch compute the same loss. A checkpoint holds the states of the ranks it
    ran on (all equal); resumed on more ranks, the new ones have none and kept their start state, so
    their samples' draws differed from an uninterrupted run's (a pi0 FSDP2 x2 checkpoint resumed on HSDP
    2x2: step 5's loss 1.822 instead of 1.749). They take rank 0's state instead."""
    import torch.distributed as dist
    from lerobot_ckpt.state import rng as rng_state

    shared = [rng_state.capture() if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    if not restored:
        rng_state.restore(shared[0])


def _warn_rounded_weights(checkpoint_dir: Path, state: ResumeState, warn: Callable[[str], None]) -> None:
    """Training keeps fp32 master weights; a ``model.safetensors`` cast by ``lerobot-convert-dcp
    --dtype`` (its shards deleted) no longer holds them, and resuming must not pass for exact."""
    art = state.record.artifacts
    if art.peft_adapter:
        return
    paths = CheckpointPaths(checkpoint_dir)
    for weights, read, what in (
        (paths.model_weights, art.model_safetensors and not art.model_dcp, "weights"),
        (
            paths.ema.model_weights,
            state.ema_restored and art.ema_safetensors and not art.ema_dcp,
            "EMA weights",
        ),
    ):
        dtype = stored_float_dtype(weights) if read and weights.is_file() else "float32"
        if dtype != "float32":
            warn(
                f"resuming from {weights}, which holds {dtype} {what} (converted with --dtype), not the "
                "run's fp32 ones: training continues from the rounded values"
            )


def _ema_notes(loop: TrainLoop, state: ResumeState) -> list[str]:
    """A shadow that does not continue is said, never silent: LeRobot's evaluation reads it."""
    has = state.record.artifacts.ema
    if loop.ema is not None and not has:
        return [
            (
                "the checkpoint has no EMA shadow (it was trained without --ema.enable=true): the EMA "
                f"starts from the resumed weights at step {state.step}"
            )
        ]
    if loop.ema is None and has:
        return [
            (
                "the checkpoint's EMA shadow is not continued (--ema.enable=false): this run's checkpoints "
                "have no pretrained_model_ema/"
            )
        ]
    return []


def _check_sampler_position(path: Path, saved: dict, num_samples: int) -> None:
    """The saved data position, typed and in range before anything is loaded: the sampler would
    otherwise refuse it with a traceback once the weights are in place."""

    def whole(key: str) -> bool:
        value = saved.get(key, 0)
        return isinstance(value, int) and not isinstance(value, bool)

    bad = next((k for k in ("epoch", "offset", "seed") if not whole(k)), None)
    if bad is None and saved.get("epoch", 0) < 0:
        bad = "epoch"
    if bad is None and not 0 <= saved.get("offset", 0) < num_samples:
        bad = "offset"
    if bad is not None:
        valid = (
            f"0..{num_samples - 1}" if bad == "offset" else "a whole number" + (" >= 0" * (bad == "epoch"))
        )
        raise CorruptCheckpointError(
            path, f"sampler.{bad} is {saved.get(bad)!r}, which is not a valid data position (valid: {valid})"
        )


def _position_state(position) -> dict | None:
    """The checkpoint's data position. A streaming source's is every rank's readers together (collective:
    the save is), so any topology can continue it; a map-style order's is the same on every rank."""
    if position is None:
        return None
    state = position.state_dict()
    return gather_states(state) if isinstance(position, StreamingDataSource) else state


def _load_streaming_position(checkpoint_dir: Path, position, saved: dict) -> list[str]:
    """Continue a streaming source at ``saved`` before anything else is loaded (a malformed or foreign
    position stops the resume there, in one line); returns its notes."""
    paths = CheckpointPaths(checkpoint_dir)
    if saved.get("kind") != "streaming":
        raise StateMismatchError(
            f"{checkpoint_dir} was trained with map-style reading (--dataset.streaming=false): its data "
            "position cannot continue a stream; resume with --dataset.streaming=false, or start a new run "
            f"from its weights with --policy.path={paths.pretrained_model}"
        )
    try:
        return position.load_state_dict(saved)
    except ValueError as err:
        raise CorruptCheckpointError(paths.training_step, f"sampler: {err}") from None


def _legacy_loop_state(record: TrainingStepRecord) -> dict:
    """Loop counters of a checkpoint written before they were saved: derived from its record."""
    return {"step": record.step, "grad_accum_steps": record.grad_accum_steps}


def _exactness_lost(record: TrainingStepRecord, run: RunInfo) -> bool:
    """Only the per-rank slicing of the data decides sample-exactness: the dp world and batch sizes.
    DDP → FSDP2 at the same world size continues bitwise, so it must not be warned about."""
    return (record.dp_world_size, record.batch_size) != (run.dp_world_size, run.batch_size)


class Checkpointer:
    """Saves at ``save_freq`` and at the last step; restores a run from a checkpoint directory.

    With ``checkpoint_async`` a save returns once the state is copied and the files are written in
    the background (``lerobot_ckpt.AsyncCheckpointer``); :meth:`wait` is then the point where a
    failed background write surfaces, as the same ``CheckpointSaveError`` a synchronous save raises
    (exit 1, one line naming the step). The runner calls it where every rank is at the same step:
    after the loop (before publishing) and on an interrupt; the next save waits by itself.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        runtime: ParallelRuntime,
        loop: TrainLoop,
        write_pretrained: Callable[[Path], None],
        base_model: BaseModel | None = None,
    ) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.loop = loop
        self.write_pretrained = write_pretrained
        self.info = run_info(cfg, runtime, base_model)
        self.last_saved: int | None = None
        self.last_path: Path | None = None
        # Collective (a gloo group for the background writes): every rank builds its Checkpointer at
        # the same point of train(), so the group is created there on all of them.
        self.saver = (
            AsyncCheckpointer.create(timeout_s=runtime.timeout_s)
            if cfg.checkpoint_async and cfg.save_checkpoint
            else None
        )
        self._on_commit: list[Callable[[Path], None]] = []  # uploads, trackers' artifacts: main rank only
        self._in_flight: Path | None = None  # an asynchronous save not known to be committed yet

    def due(self, step: int) -> bool:
        if not self.cfg.save_checkpoint:
            return False
        return step == self.cfg.steps or (self.cfg.save_freq > 0 and step % self.cfg.save_freq == 0)

    def save(self, step: int) -> str:
        """Save ``step`` (collective); returns what the ``checkpoint:`` line says: the step directory,
        and for an asynchronous save that it is still being written (it is committed, or its failure
        reported, at the next save or :meth:`wait`), so the line never claims a checkpoint that may fail."""
        loop = self.loop
        save = save_checkpoint if self.saver is None else self.saver.save
        path = save(
            Path(self.cfg.output_dir),
            step,
            run=self.info,
            objects=_training_objects(loop),
            # the checkpoint's "sampler" entry, whichever owns the position: the same keys either way
            sampler_state=_position_state(loop.position),
            loop_state=loop.state_dict(),
            write_pretrained=self.write_pretrained,
            adapter_state=_adapter_state(loop.model),
        )
        self.last_saved = step
        if self.saver is not None:
            # this save waited for the one before: that one is committed now
            self._committed(self._in_flight)
            self._in_flight = Path(path)
            return f"{path} (writing in the background)"
        self.last_path = path
        self._committed(Path(path))
        return str(path)

    def upload_to(self, uploader: CheckpointUploader) -> None:
        """Upload every checkpoint committed from now on (``--save_checkpoint_to_hub``, main rank)."""
        self.on_commit(uploader.submit)

    def on_commit(self, callback: Callable[[Path], None]) -> None:
        """Call ``callback(checkpoint_dir)`` for every checkpoint committed from now on (an asynchronous
        one when it is known committed), in the order they were saved."""
        self._on_commit.append(callback)

    def use_config(self, cfg: TrainConfig, write_pretrained: Callable[[Path], None]) -> None:
        """Save ``cfg`` with the checkpoints from now on: the run's config plus what its trackers saved
        (wandb's run id), which only exists once they started, after the resume."""
        self.cfg, self.write_pretrained = cfg, write_pretrained

    def _committed(self, path: Path | None) -> None:
        if path is not None:
            for callback in self._on_commit:
                callback(path)

    def wait(self) -> None:
        """Block until the background save in flight (if any) committed; raise its error if it failed.

        Collective in effect: call it on every rank at the same step. ``last_path`` names only
        committed checkpoints, so publishing after it uploads a complete one.
        """
        if self.saver is not None and (done := self.saver.wait()) is not None:
            self.last_path = done.path
            self._committed(Path(done.path))
            self._in_flight = None

    def resume(self, plan: ResumePlan, warn: Callable[[str], None]) -> ResumeState:
        """Restore everything, then say in one warning what differs from an uninterrupted run.

        ``plan.settings_changed`` lists optimizer/scheduler settings the new config changes: the restored
        param groups would silently keep the old ones, so the configured values are written back.
        """
        from lerobot_cli.optim.factory import optimizer_settings, reapply_settings

        loop, checkpoint_dir, settings_changed = self.loop, plan.checkpoint, plan.settings_changed
        configured = optimizer_settings(loop.optimizer)
        saved = plan.record.sampler  # read once, by the plan
        position = loop.position  # the data source (or sampler) whose position the checkpoint saved
        if position is not None and saved.get("num_samples", position.num_samples) != position.num_samples:
            # Before anything is loaded: the saved data position means nothing in another dataset.
            raise StateMismatchError(
                f"{checkpoint_dir} was trained on {saved['num_samples']} samples, but this run's dataset has "
                f"{position.num_samples} (another --dataset.episodes selection, --dataset.eval_split or "
                "--policy.drop_n_last_frames, or another dataset): its data position does not apply; resume "
                "on the same data, or start a new run from its weights with "
                f"--policy.path={CheckpointPaths(checkpoint_dir).pretrained_model}"
            )
        step_file = CheckpointPaths(checkpoint_dir).training_step
        streaming = isinstance(position, StreamingDataSource)
        data_notes: list[str] = []
        if streaming and saved:
            data_notes = _load_streaming_position(checkpoint_dir, position, saved)
        elif saved.get("kind") == "streaming":
            raise StateMismatchError(
                f"{checkpoint_dir} was trained with --dataset.streaming=true: its data position is a "
                "stream's; resume with --dataset.streaming=true, or start a new run from its weights with "
                f"--policy.path={CheckpointPaths(checkpoint_dir).pretrained_model}"
            )
        elif position is not None and saved:
            _check_sampler_position(step_file, saved, position.num_samples)
        state = load_checkpoint(
            checkpoint_dir,
            objects=_training_objects(loop),
            rank=self.runtime.rank,
            adapter_state=_adapter_state(loop.model),
        )
        if self.runtime.world_size > 1:
            _random_state_in_lockstep(state.rng_restored, self.runtime.rank)
        notes = loop.load_state_dict(state.loop_state or _legacy_loop_state(state.record))
        notes += data_notes
        if position is not None and state.sampler_state and not streaming:
            notes += position.load_state_dict(state.sampler_state)
        self.last_saved = state.step  # the resumed step is committed already: never saved again
        _warn_rounded_weights(checkpoint_dir, state, warn)
        notes += _ema_notes(loop, state)
        if loop.ema is not None and not state.ema_restored:
            loop.ema.reset()  # from the resumed weights, not the ones built before the load
        if changed := ema_changes(self.cfg, plan.saved):
            notes.append(
                f"the EMA continues with changed settings from step {state.step} on: {'; '.join(changed)}"
            )
        changes = state.record.changes_for(self.info)
        if not _exactness_lost(state.record, self.info):
            notes = [n for n in notes if "sample-exactness" not in n]
        if changes or notes:
            head = (
                f"resuming {checkpoint_dir} with a different setup ({'; '.join(changes)})"
                if changes
                else f"resuming {checkpoint_dir}"
            )
            warn(head + "".join(f"; {n}" for n in notes))
        if settings_changed:
            reapply_settings(loop.optimizer, loop.scheduler, configured)
            warn(
                f"resuming with changed optimizer/scheduler settings, applied from step {state.step} on: "
                f"{'; '.join(settings_changed)} (the restored optimizer moments are kept)"
            )
        return state
