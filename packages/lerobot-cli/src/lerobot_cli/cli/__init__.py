"""Command-line front end: dotted flags → a validated ``TrainConfig`` (torch-free)."""

from lerobot_cli.cli.errors import UsageError

__all__ = ["UsageError"]
