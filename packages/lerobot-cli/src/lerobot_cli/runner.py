"""One training run, composed: process group → workload → wrap → optimizer → resume → loop → teardown.

Every rank runs this; only the main rank prints and writes. Problems the user can fix (dataset,
topology, checkpoint files) end every rank with exit code 2 and one line; a failed checkpoint write
ends it with 1; anything else is reported with the failing rank by ``parallel_session``.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import torch
from lerobot_ckpt import CheckpointError, CheckpointPaths, CheckpointSaveError, ModelMismatchError
from lerobot_parallel import ParallelismError
from lerobot_parallel.job_message import print_once_per_job
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.teardown import parallel_session
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop.data_source import MapDataSource
from lerobot_trainloop.ema import ModelEma
from lerobot_trainloop.evaluation import evaluate
from lerobot_trainloop.loop import NonFiniteLossError, TrainLoop
from lerobot_trainloop.worker_failures import DataLoaderWorkerDied, named_worker_deaths, worker_error_message

from lerobot_cli.banner import banner_lines
from lerobot_cli.checkpointing import Checkpointer, pretrained_writer, run_info
from lerobot_cli.cli.checks import simulates
from lerobot_cli.cli.errors import PROG, UsageError, is_quiet_rank, leave_quietly
from lerobot_cli.cli.render import as_flags
from lerobot_cli.config import TrainConfig
from lerobot_cli.configio import unstructure_train_config
from lerobot_cli.data_source import make_data_sources
from lerobot_cli.datasets import DatasetError
from lerobot_cli.datasets.mixture import MixtureDataset
from lerobot_cli.datasets.stream_location import pinned
from lerobot_cli.datasets.streamed import StreamedDataset
from lerobot_cli.errors import ConfigError
from lerobot_cli.evaluation.ranks import PeerEvalFailed
from lerobot_cli.fetching import decided_on_main, prefetch
from lerobot_cli.frozen_parts import describe_frozen
from lerobot_cli.interrupt import InterruptWatch, TrainingInterrupted
from lerobot_cli.lost_worker import WorkerLostError, worker_death_line
from lerobot_cli.optim.config import OptimizerConfig
from lerobot_cli.optim.factory import build_optimizer, build_scheduler
from lerobot_cli.peft.basefile import PeftSetupError
from lerobot_cli.policies.training_run import TrainingRun, distributed_run
from lerobot_cli.publish import PublishError, ema_repo_id, publish, wants_publish
from lerobot_cli.reporting import Reporter
from lerobot_cli.rundir import RunDirWork
from lerobot_cli.runplan import RunPlan
from lerobot_cli.seeding import set_seed
from lerobot_cli.sim_eval import SimEval, SimEvalFailed, check_env_fits
from lerobot_cli.trackers import RunContext, Trackers, TrackerStartError, enabled_kinds
from lerobot_cli.workload import build_workload, sharding_plan

USER_ERRORS: tuple[type[BaseException], ...] = (
    DatasetError,
    ParallelismError,
    NonFiniteLossError,
    CheckpointError,
    PeftSetupError,
    ConfigError,  # UsageError included: policy, optimizer and sample-weighting refusals
)


def _exit(
    message: str, code: int, runtime: ParallelRuntime | None = None, release: Callable[[], None] | None = None
) -> None:
    """One ``lerobot-train: error:`` line per job (the main rank's; see ``print_once_per_job``), then exit."""
    if release is not None:  # first: once the line is out, the launcher may kill this rank
        release()
    if runtime is None and is_quiet_rank():  # refused before the group exists: the node's first rank says it
        leave_quietly(code)
    lines = [ln for ln in message.strip().splitlines() if ln.strip()]
    print_once_per_job(
        f"{PROG}: error: {as_flags(lines[-1] if lines else message)}", runtime, stream=sys.stderr
    )
    raise SystemExit(code)


def _exit_alone(message: str, code: int, release: Callable[[], None] | None = None) -> None:
    """This rank's own failure (its DataLoader worker died; its line names the rank): printed at once by
    this rank, not once per job after waiting for the main rank, which knows nothing of it."""
    if release is not None:
        release()
    print(f"{PROG}: error: {as_flags(message)}", file=sys.stderr, flush=True)
    raise SystemExit(code)


class _LowerLevelFormatter(logging.Formatter):
    """``lerobot-train: warning: …``, the one style of every warning the CLI prints."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{PROG}: {record.levelname.lower()}: {as_flags(record.getMessage())}"


def _setup_logging(is_main: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LowerLevelFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if is_main else logging.ERROR)


def run(plan: RunPlan, work: RunDirWork | None = None, release: Callable[[], None] | None = None) -> int:
    """Every rank: the whole run; ``work`` is what the main rank does to the run directory first, and
    ``release`` gives the run directory up (called before an error is printed: once the line is out,
    the launcher may kill this rank)."""
    cfg, resume = plan.cfg, plan.resume
    try:
        with parallel_session(cfg.parallelism, cfg.accelerator, device=cfg.policy.device) as runtime:
            _setup_logging(runtime.is_main)
            try:
                train(plan, runtime, work)
            except WorkerLostError as exc:
                _exit_alone(str(exc), 1, release)
            except SimEvalFailed:  # its line is out (from the rank it failed on)
                if release is not None:
                    release()
                raise SystemExit(1) from None
            except PeerEvalFailed:  # the failed rank said why
                if release is not None:
                    release()
                leave_quietly(1)
            except (CheckpointSaveError, PublishError) as exc:
                _exit(str(exc), 1, runtime, release)
            except ModelMismatchError as exc:
                _exit(str(exc) + (resume.mismatch_hint(cfg) if resume else ""), 2, runtime, release)
            except USER_ERRORS as exc:  # one raised in a DataLoader worker: its message, as without workers
                _exit(worker_error_message(exc), 2, runtime, release)
    except ParallelismError as exc:  # topology refused before the process group existed
        _exit(str(exc) + (resume.topology_hint() if resume else ""), 2, release=release)
    return 0


class _HeldOut:
    """The eval loss of ``--dataset.eval_split``'s episodes every ``--eval_steps``
    (every dp rank its share)."""

    def __init__(self, source: MapDataSource, workload, cfg: TrainConfig, loop: TrainLoop) -> None:
        self.cfg, self.loop, self.split, self.source = cfg, loop, workload.split, source
        self.ema = loop.ema if loop.ema is not None and cfg.ema.use_for_eval else None

    def describe(self) -> str:
        split, n = self.split, self.source.order.num_samples
        weights = "EMA" if self.ema is not None else "live"
        return (
            f"Eval: {len(split.eval)} of {len(split.train) + len(split.eval)} episodes held out "
            f"(--dataset.eval_split={self.cfg.dataset.eval_split}, per task the last ones; {split.tasks} "
            f"task{'s' if split.tasks != 1 else ''}); eval loss every {self.cfg.eval_steps} steps on {n} "
            f"frames with the {weights} weights"
        )

    def run(self, step: int, reporter: Reporter) -> None:
        source = self.source
        metrics = evaluate(self.loop, source, source.order.weights(), ema=self.ema, seed=self.cfg.seed)
        reporter.log_eval(step, metrics, source.order.num_samples, "EMA" if self.ema is not None else "live")


def mixture_parts(dataset) -> list[tuple[str, int, int, float]] | None:
    """A mixture's datasets for the banner: (name, frames, episodes, fps); None for one dataset."""
    if isinstance(dataset, StreamedDataset) and dataset.is_mixture:
        return [
            (name, part.meta.num_frames, part.num_episodes, part.fps)
            for name, part in zip(dataset.names, dataset.parts, strict=True)
        ]
    if not isinstance(dataset, MixtureDataset):
        return None
    return [
        (name, len(part), part.num_episodes, part.fps)
        for name, part in zip(dataset.names, dataset.parts, strict=True)
    ]


def _training_run(workload, runtime: ParallelRuntime) -> TrainingRun:
    """What the policy's ``prepare_training`` hook sees of this run: the dataset's tasks in index order."""
    tasks = tuple(text for _, text in sorted(workload.dataset.meta.tasks.items()))
    if runtime.is_distributed:
        return distributed_run(tasks, runtime.device)
    return TrainingRun(tasks=tasks, device=runtime.device)


def _start_trackers(
    cfg: TrainConfig, runtime: ParallelRuntime, workload, resume
) -> tuple[Trackers | None, TrainConfig]:
    """The main rank's trackers (``metrics.jsonl`` and those turned on), and the config with what they need
    saved (wandb's run id). A tracker that cannot start stops the job in one line, on every rank."""
    if not runtime.is_main and not enabled_kinds(cfg):
        return None, cfg
    meta = workload.dataset.meta
    context = RunContext(
        cfg=cfg,
        output_dir=Path(cfg.output_dir),
        resuming=resume is not None,
        samples_per_step=cfg.batch_size * runtime.dp_world_size,
        num_frames=meta.num_frames,
        num_episodes=meta.num_episodes,
        config=lambda: unstructure_train_config(cfg),
    )
    box: list[Trackers] = []

    def start() -> dict:
        try:
            box.append(Trackers.start(context, resume_in_place=resume is not None and resume.in_place))
        except TrackerStartError as exc:
            raise UsageError(str(exc)) from None
        return box[0].saved_config()

    saved = decided_on_main(runtime, "the trackers", start) if enabled_kinds(cfg) else start()
    if not runtime.is_main:
        return None, cfg
    for section, values in saved.items():
        cfg = attrs.evolve(cfg, **{section: attrs.evolve(getattr(cfg, section), **values)})
    return box[0], cfg


def train(plan: RunPlan, runtime: ParallelRuntime, work: RunDirWork | None = None) -> TrainLoop:
    """Train on this rank; returns the finished loop (its ``model`` is still wrapped and sharded)."""
    cfg, resume = plan.cfg, plan.resume
    run_info(cfg, runtime)  # checkpoint format vs the resolved topology: refuse before any work
    # a Hub dataset streamed at a branch: its commit now, on every rank, saved with the run
    revision = functools.partial(decided_on_main, runtime, "the streamed dataset's revision")
    cfg = attrs.evolve(cfg, dataset=pinned(cfg.dataset, revision))
    set_seed(cfg.seed)
    # as LeRobot: deterministic cuDNN on request, else its autotuner (cudnn.benchmark)
    torch.backends.cudnn.deterministic = cfg.cudnn_deterministic
    torch.backends.cudnn.benchmark = not cfg.cudnn_deterministic
    processors_from = CheckpointPaths(resume.checkpoint).pretrained_model if resume else None
    prefetch(cfg, runtime, resuming=resume is not None)  # downloads once per machine, before every rank reads
    workload = build_workload(
        cfg, device=str(runtime.device), processors_from=processors_from, resuming=resume is not None
    )
    if simulates(cfg):  # the policy's inputs and action are the env's: refused before any work
        check_env_fits(cfg.env, cfg.seed, workload.policy_config, cfg.rename_map)
    # the training and held-out batches; checks a global batch fits (cheap) and starts no worker yet
    data = make_data_sources(workload, cfg, runtime)
    plan_ = sharding_plan(cfg, workload.policy, runtime)
    # after the cheap start-up checks (batch, plan), before wrapping: FastWAM's rank 0 loads UMT5 here
    prepared = workload.policy_config.prepare_training(workload.policy, _training_run(workload, runtime))
    weighter = None
    if cfg.sample_weighting is not None:  # LeRobot's weighted loss, put on the policy before it is wrapped
        from lerobot_cli.sample_weighting.loss import weight_the_loss
        from lerobot_cli.sample_weighting.weights import sample_weighter_for_run

        chunk_size = getattr(workload.policy_config, "chunk_size", None)
        total_frames = getattr(workload.dataset.meta, "total_frames", None)
        weighter = sample_weighter_for_run(cfg, runtime, chunk_size, total_frames)
        weight_the_loss(workload.policy, weighter)
    wrapped = wrap_model(workload.policy, runtime, plan_)
    policy = wrapped.module
    opt_cfg = cfg.optimizer or OptimizerConfig()
    optimizer = build_optimizer(opt_cfg, policy.get_optim_params())
    scheduler = build_scheduler(cfg.scheduler, optimizer, cfg.steps)
    # The shadow starts as a copy of the weights as wrapped (a resume then loads it); each rank keeps
    # the EMA of what it holds: its shards under FSDP2/HSDP, the adapters alone under PEFT.
    ema = ModelEma(wrapped.module, cfg.ema) if cfg.ema.enable else None
    loop = TrainLoop(
        wrapped,
        optimizer,
        scheduler=scheduler,
        accelerator=cfg.accelerator,
        grad_clip_norm=opt_cfg.grad_clip_norm,
        allow_nonfinite_loss=cfg.allow_nonfinite_loss,
        ema=ema,
        data=data.train,
    )
    checkpointer = Checkpointer(
        cfg,
        runtime,
        loop,
        pretrained_writer(
            cfg, workload.policy_config, workload.preprocessor, workload.postprocessor, workload.policy
        ),
        base_model=plan.base_model,
    )
    warn = logging.getLogger(PROG).warning
    if resume is not None:
        checkpointer.resume(resume, warn)
    uploader = None
    if cfg.save_checkpoint_to_hub and runtime.is_main:
        from lerobot_cli.checkpoint_upload import CheckpointUploader

        uploader = CheckpointUploader(
            cfg.policy.repo_id,
            private=cfg.policy.private,
            warn=warn,
            say=lambda line: print(line, flush=True),
        )
        checkpointer.upload_to(uploader)
    for note in work.apply() if work is not None and runtime.is_main else ():
        warn(note)
    # The trackers start once nothing can refuse the run any more (the resume loaded, the run directory's
    # earlier files set aside: wandb writes under it), on the main rank; what one needs saved with the run
    # (wandb's run id) goes into every train_config.json from here on.
    trackers, cfg = _start_trackers(cfg, runtime, workload, resume)
    checkpointer.use_config(
        cfg,
        pretrained_writer(
            cfg, workload.policy_config, workload.preprocessor, workload.postprocessor, workload.policy
        ),
    )
    reporter = Reporter(
        runtime.is_main, Path(cfg.output_dir), cfg.steps, start_step=loop.step, trackers=trackers
    )
    checkpointer.on_commit(reporter.checkpoint)  # wandb's artifacts: committed checkpoints only
    watch = InterruptWatch(runtime.device, runtime.is_distributed, runtime.timeout_s)
    failed = True
    try:
        for line in banner_lines(
            cfg,
            runtime,
            policy,
            workload.dataset.meta.num_frames,
            workload.dataset.meta.num_episodes,
            loop.step,
            mixture_parts(workload.dataset),
        ):
            reporter.print(line)
        if trackers is not None and len(trackers.names) > 1:  # besides metrics.jsonl
            reporter.print(f"Tracking: {', '.join(trackers.names)}")
        for line in prepared:
            reporter.print(line)
        if weighter is not None:
            reporter.print(f"Sample weighting: {weighter.describe()}")
        # the whole plan when sharded; unsharded runs list only activation checkpointing and compile
        for line in plan_.describe() if runtime.parallelism.is_sharded else plan_.describe_regions():
            reporter.print(as_flags(line))
        if runtime.parallelism.is_sharded and (frozen := describe_frozen(policy)):
            reporter.print(frozen)
        # Every-step hooks read nothing of the device (check_finite=False), so ordinary steps cost no host
        # sync: the loss, its parts, the grad norm and the NaN check are read at log and save steps.
        loop.add_hook(lambda ev: reporter.step(ev.step, ev.output.lr), every=1, check_finite=False)
        if cfg.log_freq > 0:
            counts = data.counts  # a mixture's samples per dataset, recorded beside the metrics
            # LeRobot's sample_weighting/<name>: the weighter's global stats at every log step (numbers only)
            weighting = {
                f"sample_weighting/{k}": float(v)
                for k, v in (weighter.get_stats() if weighter is not None else {}).items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }

            def records() -> dict[str, float] | None:
                return {**(counts() if counts is not None else {}), **weighting} or None

            loop.add_hook(
                lambda ev: reporter.log(ev.step, ev.metrics, records()),
                every=cfg.log_freq,
                metrics=True,
            )
        if data.held_out is not None:  # before a save at the same step
            held_out = _HeldOut(data.held_out, workload, cfg, loop)
            reporter.print(held_out.describe())
            loop.add_hook(lambda ev: held_out.run(ev.step, reporter), every=cfg.eval_steps)
        if cfg.save_checkpoint:
            loop.add_hook(
                lambda ev: reporter.print(f"checkpoint: {checkpointer.save(ev.step)}"),
                every=cfg.save_freq or None,
                at=[cfg.steps],
            )
        if simulates(cfg):  # after the step's checkpoint, as LeRobot: a failed eval leaves it saved
            sim = SimEval(
                cfg,
                runtime,
                policy,
                loop,
                workload.preprocessor,
                workload.postprocessor,
                signalled=lambda: watch.signum,
            )
            reporter.print(sim.describe())
            loop.add_hook(lambda ev: sim.run_or_stop(ev.step, reporter), every=cfg.env_eval_freq)
        # An interrupt waits for the end of the accumulation window, so its checkpoint resumes exactly.
        loop.add_hook(lambda ev: watch.check(defer=not loop.at_window_boundary), every=1, check_finite=False)
        # The watch's handlers stay through the interrupt's save: a repeat of the signal (the launcher
        # forwarding what a scheduler sent every process) must not kill it, a later one still does.
        with watch:
            try:
                # a worker that died (the OOM killer's SIGKILL) is named, not torch's traceback from anywhere
                with named_worker_deaths(*(loader for source in data.all for loader in source.loaders)):
                    loop.run(data.train, cfg.steps)
            except DataLoaderWorkerDied as exc:
                last = checkpointer.last_path or (resume.checkpoint if resume is not None else None)
                rank = runtime.rank if runtime.is_distributed else None
                raise WorkerLostError(worker_death_line(exc, cfg.num_workers, last, rank)) from exc
            except TrainingInterrupted as exc:
                reporter.print(f"{exc} at step {loop.step}")
                # every rank is at this step: never save a NaN the last log step did not see
                loop.check_finite()
                if cfg.save_checkpoint and cfg.save_on_interrupt and checkpointer.last_saved != loop.step:
                    reporter.print(f"checkpoint: {checkpointer.save(loop.step)}")
                checkpointer.wait()  # a background save in flight commits (or fails: exit 1) before the exit
                raise SystemExit(exc.exit_code) from None
        checkpointer.wait()  # --checkpoint_async: the last save commits (or fails) before publish and exit
        if wants_publish(cfg) and checkpointer.last_path is not None:
            final = CheckpointPaths(checkpointer.last_path)
            uploaded = publish(cfg, runtime, final.pretrained_model)
            reporter.print(f"published to {cfg.policy.repo_id}: {', '.join(uploaded or [])}")
            if loop.ema is not None:  # LeRobot's: the EMA weights beside, as <repo_id>-ema
                uploaded = publish(cfg, runtime, final.pretrained_model_ema, ema=True)
                reporter.print(
                    f"published the EMA weights to {ema_repo_id(cfg)}: {', '.join(uploaded or [])}"
                )
        if runtime.is_distributed:
            torch.distributed.barrier()
        failed = False
    finally:
        try:
            if uploader is not None:  # the last checkpoint's upload (and any queued) before the exit
                uploader.close()
            reporter.close(failed)
        finally:
            # The workers end with the run, not whenever the garbage collector frees them (the loop's hooks
            # and the held-out eval hold each other): collected in a later run's forked DataLoader worker,
            # a persistent iterator fails in torch's __del__ ("can only test a child process").
            data.close()
    return loop
