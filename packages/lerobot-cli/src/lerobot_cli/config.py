"""The whole training config: one tree of frozen attrs sections, each owned by the package using it.

It is written to ``train_config.json`` with cattrs and read back to an equal object, so a
checkpoint always says exactly how it was produced.
"""

from __future__ import annotations

import datetime as _dt

from attrs import define, field, evolve

from lerobot_ckpt.formats import CheckpointFormat
from lerobot_parallel.config import AcceleratorConfig, ParallelismConfig

from lerobot_cli.datasets.config import DatasetConfig
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.peft.config import PeftConfig
from lerobot_cli.policies.config import PolicyConfig


@define(frozen=True)
class TrackioConfig:
    enable: bool = False
    project: str | None = None


def _positive(flag: str, allow_zero: bool = False):
    def check(inst, attribute, value) -> None:
        low = 0 if allow_zero else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{flag} must be an integer ≥ {low}, got {value!r}")

    return check


@define(frozen=True)
class TrainConfig:
    dataset: DatasetConfig = field(factory=DatasetConfig)
    policy: PolicyConfig | None = None
    output_dir: str | None = None
    job_name: str | None = None
    resume: bool = False
    seed: int = 1000
    steps: int = field(default=100_000, validator=_positive("--steps"))
    batch_size: int = field(default=8, validator=_positive("--batch_size"))
    num_workers: int = field(default=4, validator=_positive("--num_workers", allow_zero=True))
    log_freq: int = field(default=200, validator=_positive("--log_freq", allow_zero=True))
    save_freq: int = field(default=20_000, validator=_positive("--save_freq", allow_zero=True))
    save_checkpoint: bool = True
    checkpoint_format: CheckpointFormat = field(default=CheckpointFormat.SAFETENSORS, converter=CheckpointFormat)
    optimizer: OptimizerConfig | None = None
    scheduler: SchedulerConfig | None = None
    peft: PeftConfig | None = None
    trackio: TrackioConfig = field(factory=TrackioConfig)
    parallelism: ParallelismConfig = field(factory=ParallelismConfig)
    accelerator: AcceleratorConfig = field(factory=AcceleratorConfig)
    allow_nonfinite_loss: bool = False
    dry_run: bool = False

    def finalized(self, now: _dt.datetime | None = None) -> TrainConfig:
        """Fill what defaults from other fields: job name, output dir, optimizer/scheduler presets."""
        cfg = self
        if cfg.job_name is None:
            ds = (cfg.dataset.repo_id or "dataset").replace("/", "_")
            cfg = evolve(cfg, job_name=f"{ds}_{cfg.policy.type if cfg.policy else 'policy'}")
        if cfg.output_dir is None:
            now = now or _dt.datetime.now()
            cfg = evolve(cfg, output_dir=f"outputs/train/{now:%Y-%m-%d}/{now:%H-%M-%S}_{cfg.job_name}")
        return cfg
