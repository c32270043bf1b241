"""The gymnasium vector env of ``--eval.batch_size`` copies of an env, built as LeRobot 0.6.1's
``EnvConfig.create_envs`` builds it, so a rollout here sees what LeRobot's would for the same seeds.

LeRobot's choices kept: ``gym.make(<package>/<task>, disable_env_checker=..., **gym_kwargs)`` per copy;
``AutoresetMode.SAME_STEP`` (a finished copy is reset inside the step that ends it, and the rollout ignores
what it does after); ``AsyncVectorEnv`` with the ``forkserver`` context only when asked for and more than
one copy (one copy is always synchronous). A missing extra is one line naming ``lerobot-cli[<extra>]``
(before any import of the env package), not a ``ModuleNotFoundError`` from deep inside gymnasium.

One departure, for ``--env.type=aloha`` only (MuJoCo, through dm-control): LeRobot leaves ``MUJOCO_GL`` to the
user, and unset it makes dm-control pick GLFW, which needs a display and fails on the first render of a
headless machine. Here an unset (or empty) ``MUJOCO_GL`` is set to ``egl`` in ``os.environ`` before gym-aloha,
dm-control or mujoco is imported (they read it once, at import), and each env copy sets the same value in
its own process before it imports them: an async worker is forked from a ``forkserver`` process, which has
the environment of when it was started, perhaps before this. One tiny off-screen render then checks the
backend, so a machine without a working one stops in one line naming ``MUJOCO_GL=egl``/``osmesa`` and what
to install, not with a MuJoCo ``FatalError`` in the first rollout.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import TYPE_CHECKING

from lerobot_cli.envs.config import EnvConfig
from lerobot_cli.errors import ConfigError
from lerobot_cli.extras import missing_extra_message

if TYPE_CHECKING:
    import gymnasium as gym


class EnvUnavailableError(ConfigError):
    """The env cannot be built here: its extra is not installed, its package has no such task, or it cannot
    render (no working MuJoCo GL backend)."""


MUJOCO_ENV_TYPES = ("aloha",)  # rendered by MuJoCo: MUJOCO_GL is set for them (module docstring)
MUJOCO_GL = "MUJOCO_GL"
DEFAULT_MUJOCO_GL = "egl"  # off screen, no display: a GPU's EGL or Mesa's (libegl1)


def check_env_installed(cfg: EnvConfig) -> None:
    """Raise the one-line :class:`EnvUnavailableError` when ``cfg``'s extra is missing; cheap (no import),
    so a run can call it before it starts anything."""
    message = missing_extra_message(cfg.extra, f"--env.type={cfg.type}")
    if message is not None:
        raise EnvUnavailableError(message)


def _env_vars(cfg: EnvConfig) -> dict[str, str]:
    """The environment variables ``cfg``'s env needs, set here (an unset ``MUJOCO_GL`` -> ``egl`` for a
    MuJoCo env) and returned for each env copy to set in its own process; none for other envs."""
    if cfg.type not in MUJOCO_ENV_TYPES:
        return {}
    if not os.environ.get(MUJOCO_GL):
        os.environ[MUJOCO_GL] = DEFAULT_MUJOCO_GL
    return {MUJOCO_GL: os.environ[MUJOCO_GL]}


@functools.cache
def _mujoco_render_failure(backend: str) -> str | None:
    """Why dm-control cannot render here with ``MUJOCO_GL=backend`` (one line), or None; an 8x8 render of an
    empty model, checked once per process (dm-control picks its backend once, at import)."""
    try:
        from dm_control import mujoco

        physics = mujoco.Physics.from_xml_string("<mujoco/>")
        try:
            physics.render(height=8, width=8)
        finally:
            physics.free()
    except Exception as exc:  # noqa: BLE001 - osmesa without libOSMesa, GLFW without a display: one line
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return None


def _check_renders(cfg: EnvConfig, env_vars: dict[str, str]) -> None:
    """Raise the one-line :class:`EnvUnavailableError` when a MuJoCo env cannot render here."""
    if MUJOCO_GL not in env_vars:
        return
    backend = env_vars[MUJOCO_GL]
    failure = _mujoco_render_failure(backend)
    if failure is not None:
        raise EnvUnavailableError(
            f"--env.type={cfg.type} cannot render with MUJOCO_GL={backend} ({failure}): MuJoCo renders "
            "without a display with MUJOCO_GL=egl (libEGL: a GPU driver's, or Mesa's: apt install libegl1) "
            "or MUJOCO_GL=osmesa (apt install libosmesa6)"
        )


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


def _make_one(
    package_name: str, gym_id: str, disable_env_checker: bool, kwargs: dict, env_vars: dict[str, str]
) -> gym.Env:
    """One env; module-level so an async worker (a fresh ``forkserver`` process, where nothing has
    registered the env's id yet) unpickles it by name and imports the env's package itself, after setting
    ``env_vars`` (``MUJOCO_GL``) as the main process has them."""
    import gymnasium as gym

    os.environ.update(env_vars)
    importlib.import_module(package_name)
    return gym.make(gym_id, disable_env_checker=disable_env_checker, **kwargs)


def make_vector_env(cfg: EnvConfig, n_envs: int, use_async_envs: bool = False) -> gym.vector.VectorEnv:
    """``n_envs`` copies of ``cfg``'s env in one vector env (LeRobot's ``make_env(cfg, n_envs, use_async)``
    for a single-task env; the caller closes it)."""
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"--eval.batch_size must be a positive integer, got {n_envs!r}")
    check_env_installed(cfg)
    env_vars = _env_vars(cfg)  # before the env's package (and mujoco) is imported
    _register(cfg)
    _check_renders(cfg, env_vars)
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    make_one = functools.partial(
        _make_one, cfg.package_name, cfg.gym_id, cfg.disable_env_checker, cfg.gym_kwargs, env_vars
    )
    if use_async_envs and n_envs > 1:
        return gym.vector.AsyncVectorEnv(
            [make_one] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP, context="forkserver"
        )
    return gym.vector.SyncVectorEnv([make_one] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP)
