"""``--env.*``: LeRobot 0.6.1's env configs (``lerobot.envs.configs``), their fields and defaults.

Torch- and gym-free: a run validates them before importing either. Only what LeRobot's ``make_env`` reads is
here; which package provides the env and which lerobot-cli extra installs it are class constants, so the
one line for a missing extra names both.

PushT as LeRobot has it: ``observation_height``/``observation_width`` (384) only shape the declared
``pixels`` feature; they are not passed to gym-pusht, whose pixel observation stays 96x96 (the size LeRobot's
PushT datasets hold). Only the two dict observation types work with LeRobot's observation mapping (a bare
``state`` or ``pixels`` array is not a dict of keys), so only they are accepted here.
"""

from __future__ import annotations

from typing import Any, ClassVar

from attrs import define, field

from lerobot_cli.features import FeatureType, PolicyFeature

ACTION = "action"
OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.environment_state"
OBS_IMAGE = "observation.image"

PUSHT_OBS_TYPES = ("pixels_agent_pos", "environment_state_agent_pos")
RENDER_MODES = ("rgb_array",)  # evaluation renders off screen; "human" opens a window


def _positive(flag: str):
    def check(inst, attribute, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--env.{flag} must be a positive integer, got {value!r}")

    return check


def _choice(flag: str, choices: tuple[str, ...]):
    def check(inst, attribute, value) -> None:
        if value not in choices:
            raise ValueError(f"--env.{flag}: invalid choice {value!r} (choose from {', '.join(choices)})")

    return check


def _task(inst, attribute, value) -> None:
    if not isinstance(value, str) or not value.strip() or "/" in value:
        raise ValueError(
            f"--env.task must name one {inst.package_name} env (e.g. {inst.default_task}), got {value!r}"
        )


@define(frozen=True, kw_only=True)
class PushtEnvConfig:
    """gym-pusht's PushT (LeRobot's ``PushtEnv``): push a T-shaped block onto a target with a 2-D agent;
    the reward is the block's coverage of the target (success above 95 %)."""

    type: ClassVar[str] = "pusht"
    package_name: ClassVar[str] = "gym_pusht"  # LeRobot's f"gym_{type}": imported when the id is unregistered
    extra: ClassVar[str] = "pusht"  # lerobot-cli[pusht]
    default_task: ClassVar[str] = "PushT-v0"

    task: str = field(default="PushT-v0", validator=_task)
    fps: int = field(default=10, validator=_positive("fps"))
    episode_length: int = field(default=300, validator=_positive("episode_length"))
    obs_type: str = field(default="pixels_agent_pos", validator=_choice("obs_type", PUSHT_OBS_TYPES))
    render_mode: str = field(default="rgb_array", validator=_choice("render_mode", RENDER_MODES))
    visualization_width: int = field(default=384, validator=_positive("visualization_width"))
    visualization_height: int = field(default=384, validator=_positive("visualization_height"))
    observation_height: int = field(default=384, validator=_positive("observation_height"))
    observation_width: int = field(default=384, validator=_positive("observation_width"))
    max_parallel_tasks: int = field(default=1, validator=_positive("max_parallel_tasks"))
    disable_env_checker: bool = True

    @property
    def gym_id(self) -> str:
        return f"{self.package_name}/{self.task}"

    @property
    def gym_kwargs(self) -> dict[str, Any]:
        """What LeRobot passes to ``gym.make`` besides ``disable_env_checker`` (``PushtEnv.gym_kwargs``)."""
        return {
            "obs_type": self.obs_type,
            "render_mode": self.render_mode,
            "visualization_width": self.visualization_width,
            "visualization_height": self.visualization_height,
            "max_episode_steps": self.episode_length,
        }

    @property
    def features(self) -> dict[str, PolicyFeature]:
        """The env's features by its own keys (LeRobot's ``features`` after ``__post_init__``)."""
        features = {
            ACTION: PolicyFeature(FeatureType.ACTION, (2,)),
            "agent_pos": PolicyFeature(FeatureType.STATE, (2,)),
        }
        if self.obs_type == "pixels_agent_pos":
            features["pixels"] = PolicyFeature(
                FeatureType.VISUAL, (self.observation_height, self.observation_width, 3)
            )
        else:
            features["environment_state"] = PolicyFeature(FeatureType.ENV, (16,))
        return features

    @property
    def features_map(self) -> dict[str, str]:
        """Env key -> policy key (LeRobot's ``features_map``)."""
        return {
            ACTION: ACTION,
            "agent_pos": OBS_STATE,
            "environment_state": OBS_ENV_STATE,
            "pixels": OBS_IMAGE,
        }


EnvConfig = PushtEnvConfig  # the union of every env config, as more types land
ENV_TYPES: dict[str, type[EnvConfig]] = {PushtEnvConfig.type: PushtEnvConfig}


def env_config(env_type: str, **fields: Any) -> EnvConfig:
    """The config of ``--env.type=env_type`` with ``fields`` set; an unknown type is one line naming the
    known ones (ValueError, as every config validator here raises)."""
    cls = ENV_TYPES.get(env_type)
    if cls is None:
        raise ValueError(f"--env.type: invalid choice {env_type!r} (choose from {', '.join(ENV_TYPES)})")
    return cls(**fields)
