"""Optimizer and LR-scheduler settings (configs here; torch objects built in ``optim.factory``)."""

from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig

__all__ = ["OptimizerConfig", "SchedulerConfig"]
