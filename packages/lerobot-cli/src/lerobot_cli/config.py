"""The whole training config: one tree of frozen attrs sections, each owned by the package using it.

It is written to ``train_config.json`` with cattrs and read back to an equal object, so a
checkpoint always says exactly how it was produced. Nothing here imports torch.
"""

from __future__ import annotations

import datetime as _dt

from attrs import define, evolve, field
from lerobot_ckpt import CheckpointFormat
from lerobot_parallel.config import AcceleratorConfig, ParallelismConfig
from lerobot_parallel.validators import count
from lerobot_trainloop.config import EmaConfig

from lerobot_cli.datasets.config import DatasetConfig
from lerobot_cli.envs.config import EnvConfig
from lerobot_cli.evaluation.config import EvalConfig
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.peft.config import PeftConfig
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.rename import check_map_value
from lerobot_cli.sample_weighting.config import SampleWeightingConfig


@define(frozen=True)
class TrackioConfig:
    enable: bool = field(default=False, metadata={"help": "Log metrics and config to trackio (local-first)."})
    project: str | None = field(
        default=None, metadata={"help": "trackio project name (default: the job name)."}
    )


WANDB_MODES = ("online", "offline", "disabled")


def _wandb_project(inst, attribute, value) -> None:
    if inst.enable and (not isinstance(value, str) or not value.strip()):
        raise ValueError(
            f"--wandb.project must name a project when --wandb.enable=true, got {value!r} "
            "(LeRobot's default: lerobot)"
        )


@define(frozen=True)
class WandBConfig:
    """LeRobot 0.6.1's ``--wandb.*``, its fields and defaults (``lerobot_cli.trackers.wandb`` says what each
    does). ``run_id`` is filled in by the run itself, as LeRobot does, so a resume continues the same run."""

    enable: bool = field(default=False, metadata={"help": "Log metrics, config and checkpoints to wandb."})
    disable_artifact: bool = field(
        default=False, metadata={"help": "Do not keep each checkpoint's weights as a wandb artifact."}
    )
    project: str | None = field(
        default="lerobot", validator=_wandb_project, metadata={"help": "wandb project."}
    )
    entity: str | None = field(default=None, metadata={"help": "wandb entity (team or user)."})
    notes: str | None = field(default=None, metadata={"help": "wandb run notes."})
    run_id: str | None = field(
        default=None, metadata={"help": "wandb run id to continue (saved by the run for its resume)."}
    )
    mode: str | None = field(
        default=None,
        validator=lambda inst, attr, value: _one_of("--wandb.mode", WANDB_MODES)(inst, attr, value),
        metadata={"help": "online (default), offline (under --output_dir; `wandb sync` it later), disabled."},
    )
    add_tags: bool = field(
        default=True, metadata={"help": "Tag the run with policy:<type>, seed:<seed>, dataset:<repo_id>."}
    )


def _path_or_none(flag: str):
    def check(inst, attribute, value) -> None:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(
                f"{flag} must name a directory, got {value!r}; leave it out for the default "
                "outputs/train/<date>/<time>_<job_name>"
            )

    return check


def _one_of(flag: str, choices: tuple[str, ...]):
    def check(inst, attribute, value) -> None:
        if value is not None and value not in choices:
            raise ValueError(f"{flag}: invalid choice {value!r} (choose from {', '.join(choices)}, or null)")

    return check


def _positive(flag: str):
    def check(inst, attribute, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"{flag} must be a number of seconds > 0, got {value!r}")

    return check


def _h(text: str, **extra) -> dict:
    return {"help": text, **extra}


@define(frozen=True)
class TrainConfig:
    dataset: DatasetConfig = field(factory=DatasetConfig)
    policy: PolicyConfig | None = field(
        default=None, metadata=_h("The policy (choose with --policy.type or --policy.path).")
    )
    output_dir: str | None = field(
        default=None,
        validator=_path_or_none("--output_dir"),
        metadata=_h("Run directory (default outputs/train/<date>/<time>_<job_name>)."),
    )
    job_name: str | None = field(default=None, metadata=_h("Run name (default <dataset>_<policy type>)."))
    resume: bool = field(default=False, metadata=_h("Continue the checkpoint named by --config_path."))
    abandon_newer_checkpoints: bool = field(
        default=False,
        metadata=_h(
            "On resume from an older checkpoint, move the newer ones to <output_dir>/abandoned/ instead of "
            "refusing (never recorded as true)."
        ),
    )
    rename_map: dict[str, str] = field(
        factory=dict,
        validator=lambda _inst, _attr, value: check_map_value(value),
        metadata=_h(
            "Rename the dataset's observations to a --policy.path checkpoint's inputs, LeRobot's flag, e.g. "
            '\'{"observation.images.front": "observation.images.top"}\' (saved in the pre-processor).'
        ),
    )
    seed: int = field(default=1000, metadata=_h("Seed of model init, data order and dropout."))
    steps: int = field(
        default=100_000,
        validator=count("--steps"),
        metadata=_h("Loop steps (micro-batches per worker), not optimizer updates."),
    )
    batch_size: int = field(
        default=8, validator=count("--batch_size"), metadata=_h("Micro-batch per data-parallel worker.")
    )
    num_workers: int = field(
        default=4,
        validator=count("--num_workers", minimum=0),
        metadata=_h("DataLoader worker processes per rank."),
    )
    prefetch_factor: int = field(
        default=4,
        validator=count("--prefetch_factor"),
        metadata=_h("Batches each DataLoader worker loads ahead (LeRobot's default, 4)."),
    )
    persistent_workers: bool = field(
        default=True,
        metadata=_h(
            "Keep DataLoader workers across epochs (map-style reading; a stream has no epoch to restart)."
        ),
    )
    dataloader_multiprocessing_context: str | None = field(
        default=None,
        validator=_one_of("--dataloader_multiprocessing_context", ("fork", "spawn", "forkserver")),
        metadata=_h(
            "How DataLoader workers start: fork (the default here, where LeRobot's is spawn: the dataset's "
            "frames are in shared memory a forked worker inherits, it starts in milliseconds instead of "
            "importing torch again, and video files are opened per process after the fork), spawn or "
            "forkserver."
        ),
    )
    tolerance_s: float = field(
        default=1e-4,
        validator=_positive("--tolerance_s"),
        metadata=_h(
            "How far a frame's timestamp may be from the time asked for (seconds), as in LeRobot: video "
            "frames and timestamps further apart stop the run naming the file."
        ),
    )
    cudnn_deterministic: bool = field(
        default=False,
        metadata=_h("Deterministic cuDNN algorithms (cudnn.benchmark off; often 10-20% slower on GPU)."),
    )
    use_policy_training_preset: bool = field(
        default=True,
        metadata=_h(
            "Start from the policy's optimizer and scheduler presets (--optimizer.*/--scheduler.* flags "
            "still override their fields); false: no preset, --optimizer.type and --scheduler.type required."
        ),
    )
    log_freq: int = field(
        default=200,
        validator=count("--log_freq", minimum=0),
        metadata=_h("Log reduced metrics every N steps (0: never)."),
    )
    save_freq: int = field(
        default=20_000,
        validator=count("--save_freq", minimum=0),
        metadata=_h("Checkpoint every N steps (0: only at the end)."),
    )
    save_checkpoint: bool = field(default=True, metadata=_h("Write checkpoints at all."))
    save_checkpoint_to_hub: bool = field(
        default=False,
        metadata=_h(
            "Upload each checkpoint to --policy.repo_id under checkpoints/<step>/, tagged <step> (as "
            "LeRobot), from the main rank while training goes on; a failed upload is one warning line."
        ),
    )
    save_on_interrupt: bool = field(
        default=True, metadata=_h("On SIGINT/SIGTERM, stop all ranks at the same step and save a checkpoint.")
    )
    checkpoint_format: CheckpointFormat = field(
        default=CheckpointFormat.SAFETENSORS,
        converter=CheckpointFormat,
        metadata=_h("Model artifact of sharded runs.", choices=tuple(f.value for f in CheckpointFormat)),
    )
    checkpoint_async: bool = field(
        default=False,
        metadata=_h(
            "Copy each checkpoint's state to CPU memory and write it in the background while training "
            "goes on; the next save, the end of the run and an interrupt wait for it, and a failed write "
            "stops the run naming the step (the previous checkpoint and `last` stay)."
        ),
    )
    optimizer: OptimizerConfig | None = field(
        default=None, metadata=_h("Optimizer (default: the policy's preset; flags override fields).")
    )
    scheduler: SchedulerConfig | None = field(
        default=None, metadata=_h("LR schedule (default: the policy's preset, often none).")
    )
    peft: PeftConfig | None = field(
        default=None, metadata=_h("Adapter fine-tuning (any --peft.* flag enables it).")
    )
    sample_weighting: SampleWeightingConfig | None = field(
        default=None,
        metadata=_h(
            "Per-sample loss weights, LeRobot's RA-BC (any --sample_weighting.* flag enables it; pi0, pi05)."
        ),
    )
    eval_steps: int = field(
        default=0,
        validator=count("--eval_steps", minimum=0),
        metadata=_h("Held-out eval loss every N loop steps (0: never); needs --dataset.eval_split > 0."),
    )
    max_eval_samples: int = field(
        default=0,
        validator=count("--max_eval_samples", minimum=0),
        metadata=_h("Cap on held-out frames evaluated (the first of each task, LeRobot's rule; 0: all)."),
    )
    env: EnvConfig | None = field(
        default=None,
        metadata=_h("Simulation env to evaluate the policy in (choose with --env.type; none: no rollouts)."),
    )
    env_eval_freq: int = field(
        default=20_000,
        validator=count("--env_eval_freq", minimum=0),
        metadata=_h(
            "Roll the policy out in --env every N steps, episodes split over every rank (0: never; "
            "LeRobot's default 20000)."
        ),
    )
    eval: EvalConfig = field(factory=EvalConfig)
    trackio: TrackioConfig = field(factory=TrackioConfig)
    wandb: WandBConfig = field(factory=WandBConfig)
    ema: EmaConfig = field(factory=EmaConfig)
    parallelism: ParallelismConfig = field(factory=ParallelismConfig)
    accelerator: AcceleratorConfig = field(factory=AcceleratorConfig)
    allow_nonfinite_loss: bool = field(
        default=False, metadata=_h("Keep training when the loss is NaN/inf instead of stopping.")
    )
    dry_run: bool = field(
        default=False, metadata=_h("Validate the config, print it and exit without training.")
    )

    def finalized(self, now: _dt.datetime | None = None) -> TrainConfig:
        """Fill the names that default from other fields (job name, output dir)."""
        cfg = self
        if cfg.job_name is None:
            ds = (cfg.dataset.repo_id or "dataset").replace("/", "_")
            cfg = evolve(cfg, job_name=f"{ds}_{cfg.policy.type if cfg.policy else 'policy'}")
        if cfg.output_dir is None:
            now = now or _dt.datetime.now()
            cfg = evolve(cfg, output_dir=f"outputs/train/{now:%Y-%m-%d}/{now:%H-%M-%S}_{cfg.job_name}")
        return cfg
