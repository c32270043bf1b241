"""Refuse Accelerate *engine* configuration found in the environment (torch-free).

Accelerate is only a launcher here. Its config files (``accelerate config``,
``--config_file``) and engine flags (``--use_fsdp``, ``--use_deepspeed`` …) reach the
training process as environment variables; our engine never reads them, so a run would
silently train with settings other than the ones the user asked for, and
``train_config.json`` would lie about it. So we stop early and name the variables.

What a plain ``accelerate launch [--multi_gpu] --num_processes=N`` exports is *not* engine
configuration and must pass (checked against accelerate 1.15's ``prepare_simple_launcher_cmd_env``
and ``prepare_multi_gpu_env`` and a real launch): ``ACCELERATE_DYNAMO_*``,
``ACCELERATE_MIXED_PRECISION=no``, ``ACCELERATE_USE_CPU``, ``ACCELERATE_DEBUG_MODE``,
``ACCELERATE_CPU_AFFINITY``, ``OMP_NUM_THREADS``, ``KMP_*``, ``MASTER_ADDR``/``MASTER_PORT`` and
torchrun's own variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from attrs import define, field

ALLOW_ENV_VAR = "LEROBOT_ALLOW_ACCELERATE_ENV"
_TRUTHY = frozenset({"1", "true", "yes"})
_FALSY = frozenset({"", "0", "false", "no", "off"})

# Boolean switches: set to a false value they configure nothing, so they are not refused.
_SWITCHES = (
    "ACCELERATE_USE_FSDP",
    "ACCELERATE_USE_PARALLELISM_CONFIG",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_USE_MEGATRON_LM",  # beyond the list: same kind of engine switch
)
# Settings refused whenever present (non-empty).
_SETTINGS = (
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "ACCELERATE_GRADIENT_CLIPPING",  # written by accelerate's deepspeed launcher
)
_PREFIXES = (
    "FSDP_",
    "PARALLELISM_CONFIG_",
    "ACCELERATE_DEEPSPEED_",  # beyond the list: deepspeed engine settings
)
MIXED_PRECISION_VAR = "ACCELERATE_MIXED_PRECISION"


class AccelerateEnvError(ValueError):
    """Accelerate engine configuration is in the environment (a usage error: the CLI exits 2)."""


def is_allow_value(value: str | None) -> bool:
    """``1``/``true``/``yes`` in any case; anything else, ``0`` included, does not allow."""
    return value is not None and value.strip().lower() in _TRUTHY


@define(frozen=True)
class EnvGuardResult:
    """Outcome of :func:`check_accelerate_env`.

    ``offending`` is sorted (name, value) pairs so the message is stable across runs;
    ``allowed`` records that the user acknowledged them via ``LEROBOT_ALLOW_ACCELERATE_ENV``.
    """

    offending: tuple[tuple[str, str], ...] = field(factory=tuple)
    allowed: bool = False
    mixed_precision: str = "no"

    @property
    def clean(self) -> bool:
        return not self.offending

    @property
    def may_proceed(self) -> bool:
        return self.clean or self.allowed

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.offending)


def _offends(name: str, value: str, mixed_precision: str) -> bool:
    if not value.strip():
        return False
    if name in _SWITCHES:
        return value.strip().lower() not in _FALSY
    if name in _SETTINGS or name.startswith(_PREFIXES):
        return True
    if name == MIXED_PRECISION_VAR:
        v = value.strip().lower()
        return v != "no" and v != mixed_precision.lower()
    return False


def check_accelerate_env(
    mixed_precision: str = "no", environ: Mapping[str, str] | None = None
) -> EnvGuardResult:
    """Find Accelerate engine settings in ``environ`` (default: ``os.environ``).

    ``mixed_precision`` is our own ``accelerator.mixed_precision``: an
    ``ACCELERATE_MIXED_PRECISION`` equal to it says the same thing and is harmless.
    """
    env = os.environ if environ is None else environ
    offending = tuple(sorted((k, v) for k, v in env.items() if _offends(k, v, mixed_precision)))
    return EnvGuardResult(
        offending=offending, allowed=is_allow_value(env.get(ALLOW_ENV_VAR)), mixed_precision=mixed_precision
    )


def guard_message(result: EnvGuardResult) -> str:
    """Refusal text (or, when allowed, warning text) naming every variable and both ways out."""
    listing = "\n".join(f"  {name}={value}" for name, value in result.offending)
    if result.allowed:
        return (
            "Accelerate engine configuration found in the environment; it is IGNORED because "
            f"{ALLOW_ENV_VAR} is set. These settings are overridden by the parallelism.* / "
            f"accelerator.* settings of this run (train_config.json records what actually runs):\n{listing}"
        )
    return (
        "Refusing to start: Accelerate engine configuration found in the environment. Accelerate is "
        "only a launcher here, so these would be silently ignored and train_config.json would not "
        f"describe the run:\n{listing}\n"
        "Ways out:\n"
        "  1. unset them (do not use `accelerate config` files or `accelerate launch --use_fsdp/"
        "--use_deepspeed/--config_file`) and make the same choices with the parallelism.* / accelerator.* "
        "settings instead, e.g. parallelism.dp_shard=N, accelerator.mixed_precision=bf16, "
        "accelerator.gradient_accumulation.steps=K;\n"
        f"  2. or set {ALLOW_ENV_VAR}=1 to acknowledge that they are overridden and proceed."
    )


def enforce_accelerate_env_guard(
    mixed_precision: str = "no", environ: Mapping[str, str] | None = None, warn=None
) -> EnvGuardResult:
    """Raise :class:`AccelerateEnvError` on offending variables unless allowed.

    When allowed, ``warn`` (default: :func:`warnings.warn`) receives the override listing,
    so the CLI can route it to its logger on the main rank only.
    """
    result = check_accelerate_env(mixed_precision, environ)
    if result.clean:
        return result
    if not result.allowed:
        raise AccelerateEnvError(guard_message(result))
    if warn is None:
        import warnings

        warnings.warn(guard_message(result), stacklevel=2)
    else:
        warn(guard_message(result))
    return result
