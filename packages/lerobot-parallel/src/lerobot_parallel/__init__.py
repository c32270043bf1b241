"""Topology, device mesh and model wrapping for data-parallel training (DDP, FSDP2, HSDP).

Importing the package does not import torch (a CLI's ``--help`` must stay fast): configs,
the env guard, launch-env parsing, the launcher watch and batch arithmetic are eager; the
torch-using names (runtime, teardown, wrapping, sharding plan, clipping, precision) load on
first attribute access. The launcher watch is eager also because importing it records the
parent process, as early as possible.
"""

from typing import TYPE_CHECKING

from lerobot_parallel.batching import effective_batch_line, effective_batch_size, samples_per_loop_step
from lerobot_parallel.config import (
    AcceleratorConfig,
    ActivationCheckpointingConfig,
    CompileConfig,
    DDPConfig,
    FSDPConfig,
    GradientAccumulationConfig,
    MixedPrecisionPolicyConfig,
    ParallelismConfig,
)
from lerobot_parallel.env_guard import (
    ALLOW_ENV_VAR,
    AccelerateEnvError,
    EnvGuardResult,
    check_accelerate_env,
    enforce_accelerate_env_guard,
    guard_message,
)
from lerobot_parallel.errors import ConfigTypeError, ParallelismError, ShardingError
from lerobot_parallel.launch_env import LaunchEnv, LaunchEnvError
from lerobot_parallel.watchdog import LAUNCHER_GONE_EXIT_CODE, LauncherWatch, launcher_watch_wanted

__version__ = "0.1.0"

if TYPE_CHECKING:  # the lazy names as real imports, for readers and type checkers (never run)
    from lerobot_parallel.grad_clip import clip_grad_norm, total_grad_norm
    from lerobot_parallel.memory import MemoryEstimate, estimate_memory, measure_rank_bytes
    from lerobot_parallel.plan import ShardingPlan, build_plan
    from lerobot_parallel.precision import Precision, build_precision
    from lerobot_parallel.runtime import ParallelRuntime, backend_for, init_runtime, resolve_device
    from lerobot_parallel.teardown import parallel_session, report_rank_failure, shutdown_process_group
    from lerobot_parallel.wrap import WrappedModel, wrap_model

_LAZY = {
    "ParallelRuntime": "lerobot_parallel.runtime",
    "init_runtime": "lerobot_parallel.runtime",
    "resolve_device": "lerobot_parallel.runtime",
    "backend_for": "lerobot_parallel.runtime",
    "parallel_session": "lerobot_parallel.teardown",
    "shutdown_process_group": "lerobot_parallel.teardown",
    "report_rank_failure": "lerobot_parallel.teardown",
    "WrappedModel": "lerobot_parallel.wrap",
    "wrap_model": "lerobot_parallel.wrap",
    "ShardingPlan": "lerobot_parallel.plan",
    "build_plan": "lerobot_parallel.plan",
    "clip_grad_norm": "lerobot_parallel.grad_clip",
    "total_grad_norm": "lerobot_parallel.grad_clip",
    "MemoryEstimate": "lerobot_parallel.memory",
    "estimate_memory": "lerobot_parallel.memory",
    "measure_rank_bytes": "lerobot_parallel.memory",
    "Precision": "lerobot_parallel.precision",
    "build_precision": "lerobot_parallel.precision",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lerobot_parallel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ALLOW_ENV_VAR",
    "LAUNCHER_GONE_EXIT_CODE",
    "AccelerateEnvError",
    "AcceleratorConfig",
    "ActivationCheckpointingConfig",
    "CompileConfig",
    "ConfigTypeError",
    "DDPConfig",
    "EnvGuardResult",
    "FSDPConfig",
    "GradientAccumulationConfig",
    "LaunchEnv",
    "LaunchEnvError",
    "LauncherWatch",
    "MemoryEstimate",
    "MixedPrecisionPolicyConfig",
    "ParallelRuntime",
    "ParallelismConfig",
    "ParallelismError",
    "Precision",
    "ShardingError",
    "ShardingPlan",
    "WrappedModel",
    "backend_for",
    "build_plan",
    "build_precision",
    "check_accelerate_env",
    "clip_grad_norm",
    "effective_batch_line",
    "effective_batch_size",
    "enforce_accelerate_env_guard",
    "estimate_memory",
    "guard_message",
    "init_runtime",
    "launcher_watch_wanted",
    "measure_rank_bytes",
    "parallel_session",
    "report_rank_failure",
    "resolve_device",
    "samples_per_loop_step",
    "shutdown_process_group",
    "total_grad_norm",
    "wrap_model",
]
