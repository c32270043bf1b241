"""What a run will do to its directory and its inputs, decided before torch loads (every rank alike).

A resume is where a run most easily trains the wrong thing without any error: a frozen base that
moved on, a config naming a directory the checkpoint is no longer in, a flag the restored optimizer
ignores, an older checkpoint resumed over newer ones. Each of those is decided here, from files
alone, into either a refusal (one :class:`UsageError` sentence) or a note said once, and the
config the run uses is rewritten to say what it really uses (so ``train_config.json`` never lies).
"""

from __future__ import annotations

from pathlib import Path

import attrs
from attrs import define
from lerobot_ckpt import (
    BaseModel,
    CheckpointError,
    CheckpointPaths,
    TrainingStepRecord,
    read_training_step,
    resolve_checkpoint_dir,
)
from lerobot_ckpt.discovery import newer_checkpoints
from lerobot_ckpt.layout import CHECKPOINTS_DIR
from lerobot_ckpt.pretrained import pretrained_weights_file, weights_sha256

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.config import TrainConfig
from lerobot_cli.configio import ConfigFileError, load_train_config
from lerobot_cli.peft.basefile import PeftSetupError, base_reference, is_adapter_dir, resolve_recorded_base

ABANDON_FLAG = "--abandon_newer_checkpoints=true"


@define(frozen=True)
class ResumePlan:
    checkpoint: Path  # the real step directory (never `last`)
    run_dir: Path  # where the resumed run writes
    record: TrainingStepRecord
    saved: TrainConfig | None  # the checkpoint's train_config.json (None when unreadable)
    abandon: tuple[Path, ...] = ()  # newer step directories to set aside before training
    settings_changed: tuple[str, ...] = ()  # optimizer/scheduler changes the resume applies
    degrees_from_checkpoint: bool = False  # the topology was not given by flags

    @property
    def step(self) -> int:
        return self.record.step

    def branch_refusal(self, directory: Path) -> UsageError:
        """A branch (``--output_dir`` elsewhere) must start in an empty directory."""
        holder = self.checkpoint.parent.parent if self.checkpoint.parent.name == CHECKPOINTS_DIR else None
        return UsageError(
            f"--output_dir={directory} is not the run that holds {self.checkpoint} ({holder or 'no run'}) "
            "and is not empty: drop --output_dir to continue that run in place, or pass a new directory to "
            "continue it there (the original is left untouched)"
        )

    @property
    def in_place(self) -> bool:
        """The run continues in the directory that holds the checkpoint (not a new branch of it)."""
        return self.checkpoint.parent.parent == self.run_dir

    def topology_hint(self) -> str:
        if not self.degrees_from_checkpoint:
            return ""
        p = self.saved.parallelism if self.saved is not None else None
        shown = f"dp_replicate={p.dp_replicate}, dp_shard={p.dp_shard}" if p is not None else "the degrees"
        return (
            f" ({shown} come from the checkpoint's train_config.json; override them for this launch with "
            "--parallelism.dp_replicate=… --parallelism.dp_shard=…)"
        )

    def mismatch_hint(self, cfg: TrainConfig) -> str:
        """Why weights may not fit: the policy fields this run changes relative to the checkpoint."""
        if self.saved is None or self.saved.policy is None or cfg.policy is None:
            return ""
        old, new = attrs.asdict(self.saved.policy, recurse=False), attrs.asdict(cfg.policy, recurse=False)
        skip = {"device", "pretrained_path", "push_to_hub", "repo_id", "private", "tags", "license"}
        changed = [f"policy.{k}" for k in new if k not in skip and old.get(k) != new[k]]
        if not changed:
            return ""
        return f" (this resume changes {', '.join(changed)} relative to the checkpoint's config)"


@define(frozen=True)
class RunPlan:
    cfg: TrainConfig
    resume: ResumePlan | None = None
    base_model: BaseModel | None = None  # the pinned frozen base of a PEFT run
    notes: tuple[str, ...] = ()  # said once by the main rank before training


def _flag_given(flags: dict[str, str], *names: str) -> bool:
    return any(n in flags or any(f.startswith(n + ".") for f in flags) for n in names)


def ema_changes(cfg: TrainConfig, saved: TrainConfig | None) -> list[str]:
    """EMA settings a resume changes while both runs keep one (the restored EMA continues under them)."""
    if saved is None or not (cfg.ema.enable and saved.ema.enable):
        return []
    return _section_changes("ema", saved.ema, cfg.ema)


def _section_changes(name: str, old, new) -> list[str]:
    if old is None or new is None:
        return []
    a, b = attrs.asdict(old), attrs.asdict(new)
    return [f"{name}.{k}: {a[k]!r} → {b[k]!r}" for k in b if a.get(k) != b[k]]


def _settings_changes(cfg: TrainConfig, saved: TrainConfig) -> list[str]:
    """Optimizer/scheduler settings the resumed run uses that differ from what the checkpoint ran with."""
    if (
        cfg.optimizer is not None
        and saved.optimizer is not None
        and cfg.optimizer.type != saved.optimizer.type
    ):
        raise UsageError(
            f"--optimizer.type={cfg.optimizer.type} differs from the checkpoint's {saved.optimizer.type}: "
            "its optimizer state cannot continue in another optimizer; resume with the same type, or start a "
            "new run from the weights with --policy.path=<checkpoint>/pretrained_model"
        )
    if (cfg.scheduler is None) != (saved.scheduler is None):
        what = (
            "adds a scheduler the checkpoint ran without"
            if saved.scheduler is None
            else "drops the checkpoint's scheduler"
        )
        raise UsageError(
            f"this resume {what} (--scheduler): a schedule cannot be added or removed mid-run; resume with "
            "the saved --scheduler settings, or start a new run with "
            "--policy.path=<checkpoint>/pretrained_model"
        )
    changes = _section_changes("optimizer", saved.optimizer, cfg.optimizer)
    changes += _section_changes("scheduler", saved.scheduler, cfg.scheduler)
    sched = cfg.scheduler
    if sched is not None and cfg.steps != saved.steps:
        was, now = sched.fitted_steps(saved.steps), sched.fitted_steps(cfg.steps)
        if was != now:
            changes.append(
                f"the schedule follows --steps: warm-up {was[0]} → {now[0]} steps, decay ends at step "
                f"{was[1]} → {now[1]}"
            )
    return changes


def _run_dir_for(checkpoint: Path, cfg: TrainConfig, flags: dict[str, str], notes: list[str]) -> Path:
    """Resume continues the run that holds the checkpoint; ``--output_dir`` elsewhere branches off it."""
    holder = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS_DIR else None
    if flags.get("output_dir", "null").strip().lower() != "null":  # `--output_dir=null`: as if not given
        given = Path(cfg.output_dir).expanduser()
        if holder is not None and given.resolve() == holder.resolve():
            return holder
        # whether the new directory is empty is the main rank's to check, under the run lock (rundir)
        notes.append(
            f"continuing {checkpoint} in the new run directory {given} (the checkpoint's own run is not "
            "modified)"
        )
        return given
    if holder is None:
        raise UsageError(
            f"{checkpoint} is not inside a run's {CHECKPOINTS_DIR}/ directory, so there is no run to "
            "continue: pass --output_dir=<new directory> to continue it there"
        )
    saved_dir = Path(cfg.output_dir).expanduser() if cfg.output_dir else None
    if saved_dir is None or saved_dir.resolve() != holder.resolve():
        notes.append(
            f"continuing the run in {holder}, which holds the checkpoint (its train_config.json names "
            f"output_dir={cfg.output_dir}: the run was moved or copied); it writes there"
        )
    return holder


def _pin_base(
    cfg: TrainConfig, record: TrainingStepRecord | None, notes: list[str], is_main: bool
) -> tuple[TrainConfig, BaseModel | None]:
    """The frozen base of a PEFT run, resolved to a directory that cannot move and checked by digest."""
    path = cfg.policy.pretrained_path if cfg.policy is not None else None
    if not path:
        return cfg, None
    adapter = is_adapter_dir(path)
    if cfg.peft is None and not adapter:
        return cfg, None
    try:
        if adapter:  # training an adapter further: its base is the one its own files name
            from lerobot_cli.policies.location import resolve_policy_dir

            base_dir = resolve_recorded_base(path, resolve_policy_dir)
            expected = record.base_model if record is not None else _recorded_pin(Path(path))
        else:
            base_dir = Path(path).expanduser().resolve()
            expected = record.base_model if record is not None else None
        weights = pretrained_weights_file(base_dir)
    except (PeftSetupError, CheckpointError) as exc:
        raise UsageError(str(exc)) from None
    if not adapter:  # every rank loads the base from the directory that cannot move
        cfg = attrs.evolve(cfg, policy=attrs.evolve(cfg.policy, pretrained_path=str(base_dir)))
    if not is_main:
        # Hashing a multi-GB base once is enough: the main rank verifies it (and refuses for the job, as
        # for the run lock) and writes the record that carries the pin.
        return cfg, None
    digest = weights_sha256(weights)
    pin = BaseModel(reference=base_reference(base_dir), weights_sha256=digest)
    if expected is not None and expected.weights_sha256 != digest:
        raise UsageError(
            f"the frozen base policy of this PEFT run changed: {base_dir} now holds weights with sha256 "
            f"{digest[:12]}…, but the adapter was trained on {expected.reference} with sha256 "
            f"{expected.weights_sha256[:12]}… (retrained, replaced or re-pointed since); restore that base, "
            "or start a new adapter on the current one with --policy.path=<base> --peft.*"
        )
    if record is not None and expected is None:
        notes.append(
            f"this checkpoint does not pin its frozen base (written before base pinning): {base_dir} is "
            "used as the base without a check that it is the one the adapter was trained on"
        )
    return cfg, pin


def _recorded_pin(adapter_dir: Path) -> BaseModel | None:
    """The pin a checkpoint's ``training_step.json`` holds for the adapter in its ``pretrained_model/``."""
    try:
        return read_training_step(adapter_dir).base_model
    except CheckpointError:
        return None  # an adapter directory outside a checkpoint: nothing recorded to check against


PUBLISH_FIELDS = ("repo_id", "push_to_hub", "private")  # where the final policy is uploaded


def publish_from_flags(cfg: TrainConfig, flags: dict[str, str]) -> tuple[TrainConfig, str | None]:
    """On a resume, where the run publishes comes from the command line only.

    The saved ``train_config.json`` is data a checkpoint's sender chose: its ``policy.repo_id``,
    ``push_to_hub`` and ``private`` would otherwise make a plain resume upload the policy to a repo
    of theirs. Each one not given as a flag is reset to its default; when that drops a repo the
    checkpoint would have published to, the returned note says so (so a user resuming their own run
    knows to pass it again)."""
    if not cfg.resume or cfg.policy is None:
        return cfg, None
    defaults = {a.name: a.default for a in attrs.fields(type(cfg.policy)) if a.name in PUBLISH_FIELDS}
    reset = {
        name: default
        for name, default in defaults.items()
        if f"policy.{name}" not in flags and getattr(cfg.policy, name) != default
    }
    if not reset:
        return cfg, None
    named = cfg.policy.repo_id
    note = None
    if "repo_id" in reset and cfg.policy.push_to_hub:
        note = (
            f"not publishing: the checkpoint named --policy.repo_id={named}; pass it again to publish "
            "(a resume publishes only where its own flags say)"
        )
    return attrs.evolve(cfg, policy=attrs.evolve(cfg.policy, **reset)), note


def plan_resume(
    cfg: TrainConfig, flags: dict[str, str], config_path: Path
) -> tuple[TrainConfig, ResumePlan, list[str]]:
    notes: list[str] = []
    try:
        checkpoint = resolve_checkpoint_dir(config_path)
        record = read_training_step(checkpoint)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    try:
        saved = load_train_config(CheckpointPaths(checkpoint).train_config)
    except ConfigFileError:
        saved = None
    if cfg.steps <= record.step:
        raise UsageError(
            f"--steps={cfg.steps} but the checkpoint {checkpoint} is already at step {record.step}: nothing "
            f"would be trained; pass --steps larger than {record.step} to train further"
        )
    if (
        saved is not None
        and saved.policy is not None
        and cfg.policy is not None
        and cfg.policy.type != saved.policy.type
    ):
        raise UsageError(
            f"--policy.type={cfg.policy.type} but the checkpoint {checkpoint} holds a "
            f"{saved.policy.type} policy; a resume continues the same policy"
        )
    run_dir = _run_dir_for(checkpoint, cfg, flags, notes)
    allowed = cfg.abandon_newer_checkpoints
    # Never recorded as true: a later resume from this run's config must decide again.
    cfg = attrs.evolve(cfg, output_dir=str(run_dir), abandon_newer_checkpoints=False)
    abandon: list[Path] = []
    if run_dir == checkpoint.parent.parent:
        newer = newer_checkpoints(checkpoint.parent, record.step)
        if newer and not allowed:
            names = ", ".join(p.name for p in newer)
            raise UsageError(
                f"{checkpoint.parent} holds checkpoints newer than {checkpoint.name} ({names}) that resuming "
                f"in place would replace: resume from checkpoints/last, pass {ABANDON_FLAG} to move them to "
                f"{run_dir}/abandoned/ (nothing is deleted), or --output_dir=<new directory> to continue "
                f"{checkpoint.name} there"
            )
        abandon = newer
    changes = _settings_changes(cfg, saved) if saved is not None else []
    plan = ResumePlan(
        checkpoint=checkpoint,
        run_dir=run_dir,
        record=record,
        saved=saved,
        abandon=tuple(abandon),
        settings_changed=tuple(changes),
        degrees_from_checkpoint=not _flag_given(flags, "parallelism"),
    )
    return cfg, plan, notes


def plan_run(
    cfg: TrainConfig, flags: dict[str, str], config_path: Path | None, is_main: bool = True
) -> RunPlan:
    """The run's plan, or a :class:`UsageError`; reads files only (run on every rank, before torch;
    ``is_main``: the rank that writes, which alone hashes a PEFT base to pin it)."""
    notes: list[str] = []
    resume = None
    if cfg.resume:
        cfg, resume, notes = plan_resume(cfg, flags, config_path)
    elif cfg.abandon_newer_checkpoints:
        raise UsageError(f"{ABANDON_FLAG} only applies to a resume (--resume=true --config_path=…)")
    cfg, base = _pin_base(cfg, resume.record if resume else None, notes, is_main)
    check_accumulation_alignment(cfg)
    return RunPlan(cfg=cfg, resume=resume, base_model=base, notes=tuple(notes))


def check_accumulation_alignment(cfg: TrainConfig) -> None:
    """Checkpoints land on gradient-accumulation window boundaries, so every one resumes exactly.

    A window's gradients live only in memory; a checkpoint taken inside one could not bring them
    back. So the save frequency and (when checkpoints are saved) the last step must be multiples of
    the accumulation steps; an interrupt finishes its window before it saves.
    """
    k = cfg.accelerator.gradient_accumulation.steps
    if k == 1 or not cfg.save_checkpoint:
        return
    if cfg.save_freq % k:
        raise UsageError(
            f"--save_freq={cfg.save_freq} is not a multiple of "
            f"--accelerator.gradient_accumulation.steps={k}: checkpoints are saved on accumulation-window "
            f"boundaries only (a save inside a window could not resume exactly); use a multiple of {k}"
        )
    if cfg.steps % k:
        raise UsageError(
            f"--steps={cfg.steps} is not a multiple of --accelerator.gradient_accumulation.steps={k}: the "
            f"final checkpoint would land inside an accumulation window whose {cfg.steps % k} "
            f"micro-batch(es) are never applied; use a multiple of {k} (or --save_checkpoint=false)"
        )
