"""Checkpoint layout, formats and conversion for LeRobot training runs (no accelerate, no CLI)."""

from lerobot_ckpt.formats import CheckpointFormat

__version__ = "0.1.0"

__all__ = ["CheckpointFormat"]
