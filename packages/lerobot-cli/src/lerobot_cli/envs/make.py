"""The gymnasium vector env of ``--eval.batch_size`` copies of an env, built as LeRobot 0.6.1's
``EnvConfig.create_envs`` builds it, so a rollout here sees what LeRobot's would for the same seeds.

LeRobot's choices kept: ``gym.make(<package>/<task>, disable_env_checker=..., **gym_kwargs)`` per copy;
``AutoresetMode.SAME_STEP`` (a finished copy is reset inside the step that ends it, and the rollout ignores
what it does after); ``AsyncVectorEnv`` with the ``forkserver`` context only when asked for and more than
one copy (one copy is always synchronous). A missing extra is one line naming ``lerobot-cli[<extra>]``
(before any import of the env package), not a ``ModuleNotFoundError`` from deep inside gymnasium.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

from lerobot_cli.envs.config import EnvConfig
from lerobot_cli.errors import ConfigError
from lerobot_cli.extras import missing_extra_message

if TYPE_CHECKING:
    import gymnasium as gym


class EnvUnavailableError(ConfigError):
    """The env cannot be built here: its extra is not installed, or its package has no such task."""


def check_env_installed(cfg: EnvConfig) -> None:
    """Raise the one-line :class:`EnvUnavailableError` when ``cfg``'s extra is missing; cheap (no import),
    so a run can call it before it starts anything."""
    message = missing_extra_message(cfg.extra, f"--env.type={cfg.type}")
    if message is not None:
        raise EnvUnavailableError(message)


def _register(cfg: EnvConfig) -> None:
    """Import the env's package (which registers its ids) and check it registers ``cfg.gym_id``."""
    from gymnasium.envs.registration import registry

    if cfg.gym_id in registry:
        return
    importlib.import_module(cfg.package_name)
    if cfg.gym_id not in registry:
        known = sorted(name.partition("/")[2] for name in registry if name.startswith(cfg.package_name + "/"))
        raise EnvUnavailableError(
            f"--env.task={cfg.task}: {cfg.package_name} has no env {cfg.task!r} (it has {', '.join(known)})"
        )


def _make_one(package_name: str, gym_id: str, disable_env_checker: bool, kwargs: dict) -> gym.Env:
    """One env; module-level so an async worker (a fresh ``forkserver`` process, where nothing has
    registered the env's id yet) unpickles it by name and imports the env's package itself."""
    import gymnasium as gym

    importlib.import_module(package_name)
    return gym.make(gym_id, disable_env_checker=disable_env_checker, **kwargs)


def make_vector_env(cfg: EnvConfig, n_envs: int, use_async_envs: bool = False) -> gym.vector.VectorEnv:
    """``n_envs`` copies of ``cfg``'s env in one vector env (LeRobot's ``make_env(cfg, n_envs, use_async)``
    for a single-task env; the caller closes it)."""
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"--eval.batch_size must be a positive integer, got {n_envs!r}")
    check_env_installed(cfg)
    _register(cfg)
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    make_one = functools.partial(
        _make_one, cfg.package_name, cfg.gym_id, cfg.disable_env_checker, cfg.gym_kwargs
    )
    if use_async_envs and n_envs > 1:
        return gym.vector.AsyncVectorEnv(
            [make_one] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP, context="forkserver"
        )
    return gym.vector.SyncVectorEnv([make_one] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP)
