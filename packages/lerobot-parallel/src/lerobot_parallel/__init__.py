"""Topology, device mesh and model wrapping for data-parallel training (DDP, FSDP2, HSDP)."""

from lerobot_parallel.config import (
    AcceleratorConfig,
    DDPConfig,
    FSDPConfig,
    GradientAccumulationConfig,
    MixedPrecisionPolicyConfig,
    ParallelismConfig,
    ParallelismError,
)

__version__ = "0.1.0"

__all__ = [
    "AcceleratorConfig",
    "DDPConfig",
    "FSDPConfig",
    "GradientAccumulationConfig",
    "MixedPrecisionPolicyConfig",
    "ParallelismConfig",
    "ParallelismError",
]
