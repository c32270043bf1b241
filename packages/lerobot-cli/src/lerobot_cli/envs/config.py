"""``--env.*``: LeRobot 0.6.1's env configs (``lerobot.envs.configs``), their fields and defaults.

Torch- and gym-free: a run validates them before importing either. Only what LeRobot's ``make_env`` reads is
here; which package provides the env and which lerobot-cli extra installs it are class constants, so the
one line for a missing extra names both.

PushT as LeRobot has it: ``observation_height``/``observation_width`` (384) only shape the declared
``pixels`` feature; they are not passed to gym-pusht, whose pixel observation stays 96x96 (the size LeRobot's
PushT datasets hold). Only the two dict observation types work with LeRobot's observation mapping (a bare
``state`` or ``pixels`` array is not a dict of keys), so only they are accepted here.

ALOHA as LeRobot has it: gym-aloha's two bimanual tasks (14-D joint positions and actions, one 480x640
``top`` camera); ``observation_height``/``observation_width`` again only shape the declared feature (gym-aloha
is not passed them). Only ``pixels_agent_pos`` is accepted: LeRobot's mapping turns it into
``observation.images.top`` and ``observation.state``, but gym-aloha's ``pixels`` type observes a bare
``{"top": ...}``, which LeRobot's mapping passes on as a float ``observation.top`` that no policy reads (not
the ``observation.image.top`` its ``features_map`` declares), and ``state`` is not implemented in gym-aloha.
"""

from __future__ import annotations

from typing import Any, ClassVar

from attrs import define, field

from lerobot_cli.features import FeatureType, PolicyFeature

ACTION = "action"
OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.environment_state"
OBS_IMAGE = "observation.image"
OBS_IMAGES = "observation.images"

PUSHT_OBS_TYPES = ("pixels_agent_pos", "environment_state_agent_pos")
ALOHA_TASKS = ("AlohaInsertion-v0", "AlohaTransferCube-v0")  # what gym-aloha 0.1.x registers
ALOHA_OBS_TYPES = ("pixels_agent_pos",)
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
class EnvConfig:
    """The base of every ``--env.type``: a subclass names its ``type``, the package providing it and the
    lerobot-cli extra installing it (class constants), and its fields are ``--env.<field>`` flags.
    ``train_config.json`` holds it as ``{"type": ..., <fields>}`` (``configio``)."""

    type: ClassVar[str] = ""
    package_name: ClassVar[str] = ""
    extra: ClassVar[str] = ""
    default_task: ClassVar[str] = ""

    @property
    def gym_id(self) -> str:
        return f"{self.package_name}/{self.task}"  # type: ignore[attr-defined]


@define(frozen=True, kw_only=True)
class PushtEnvConfig(EnvConfig):
    """gym-pusht's PushT (LeRobot's ``PushtEnv``): push a T-shaped block onto a target with a 2-D agent;
    the reward is the block's coverage of the target (success above 95 %)."""

    type: ClassVar[str] = "pusht"
    package_name: ClassVar[str] = "gym_pusht"  # LeRobot's f"gym_{type}": imported when the id is unregistered
    extra: ClassVar[str] = "pusht"  # lerobot-cli[pusht]
    default_task: ClassVar[str] = "PushT-v0"

    task: str = field(default="PushT-v0", validator=_task, metadata={"help": "gym-pusht env id."})
    fps: int = field(default=10, validator=_positive("fps"), metadata={"help": "Frames per second (videos)."})
    episode_length: int = field(
        default=300, validator=_positive("episode_length"), metadata={"help": "Steps before an episode ends."}
    )
    obs_type: str = field(
        default="pixels_agent_pos",
        validator=_choice("obs_type", PUSHT_OBS_TYPES),
        metadata={"help": "What the env observes.", "choices": PUSHT_OBS_TYPES},
    )
    render_mode: str = field(
        default="rgb_array",
        validator=_choice("render_mode", RENDER_MODES),
        metadata={"help": "Off-screen rendering.", "choices": RENDER_MODES},
    )
    visualization_width: int = field(
        default=384, validator=_positive("visualization_width"), metadata={"help": "Video width."}
    )
    visualization_height: int = field(
        default=384, validator=_positive("visualization_height"), metadata={"help": "Video height."}
    )
    observation_height: int = field(
        default=384,
        validator=_positive("observation_height"),
        metadata={"help": "Declared only, as LeRobot's (gym-pusht observes 96x96)."},
    )
    observation_width: int = field(
        default=384,
        validator=_positive("observation_width"),
        metadata={"help": "Declared only, as LeRobot's (gym-pusht observes 96x96)."},
    )
    max_parallel_tasks: int = field(
        default=1, validator=_positive("max_parallel_tasks"), metadata={"help": "LeRobot's (one task here)."}
    )
    disable_env_checker: bool = field(default=True, metadata={"help": "Skip gymnasium's env checker."})

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


@define(frozen=True, kw_only=True)
class AlohaEnvConfig(EnvConfig):
    """gym-aloha's ALOHA (LeRobot's ``AlohaEnv``): two ViperX arms in MuJoCo insert a peg into a socket or
    hand a cube over; the reward counts the task's stages (success at 4). Rendered off screen through
    MuJoCo, with ``MUJOCO_GL=egl`` when ``MUJOCO_GL`` is unset (``lerobot_cli.envs.make``)."""

    type: ClassVar[str] = "aloha"
    package_name: ClassVar[str] = "gym_aloha"  # LeRobot's f"gym_{type}"
    extra: ClassVar[str] = "aloha"  # lerobot-cli[aloha]
    default_task: ClassVar[str] = "AlohaInsertion-v0"

    task: str = field(
        default="AlohaInsertion-v0",
        validator=_choice("task", ALOHA_TASKS),
        metadata={"help": "gym-aloha env id.", "choices": ALOHA_TASKS},
    )
    fps: int = field(default=50, validator=_positive("fps"), metadata={"help": "Frames per second (videos)."})
    episode_length: int = field(
        default=400, validator=_positive("episode_length"), metadata={"help": "Steps before an episode ends."}
    )
    obs_type: str = field(
        default="pixels_agent_pos",
        validator=_choice("obs_type", ALOHA_OBS_TYPES),
        metadata={"help": "What the env observes.", "choices": ALOHA_OBS_TYPES},
    )
    render_mode: str = field(
        default="rgb_array",
        validator=_choice("render_mode", RENDER_MODES),
        metadata={"help": "Off-screen rendering.", "choices": RENDER_MODES},
    )
    observation_height: int = field(
        default=480,
        validator=_positive("observation_height"),
        metadata={"help": "Declared only, as LeRobot's (gym-aloha observes 480x640)."},
    )
    observation_width: int = field(
        default=640,
        validator=_positive("observation_width"),
        metadata={"help": "Declared only, as LeRobot's (gym-aloha observes 480x640)."},
    )
    max_parallel_tasks: int = field(
        default=1, validator=_positive("max_parallel_tasks"), metadata={"help": "LeRobot's (one task here)."}
    )
    disable_env_checker: bool = field(default=True, metadata={"help": "Skip gymnasium's env checker."})

    @property
    def gym_kwargs(self) -> dict[str, Any]:
        """What LeRobot passes to ``gym.make`` besides ``disable_env_checker`` (``AlohaEnv.gym_kwargs``)."""
        return {
            "obs_type": self.obs_type,
            "render_mode": self.render_mode,
            "max_episode_steps": self.episode_length,
        }

    @property
    def features(self) -> dict[str, PolicyFeature]:
        """The env's features by its own keys (LeRobot's ``features`` after ``__post_init__``)."""
        return {
            ACTION: PolicyFeature(FeatureType.ACTION, (14,)),
            "agent_pos": PolicyFeature(FeatureType.STATE, (14,)),
            "pixels/top": PolicyFeature(
                FeatureType.VISUAL, (self.observation_height, self.observation_width, 3)
            ),
        }

    @property
    def features_map(self) -> dict[str, str]:
        """Env key -> policy key (LeRobot's ``features_map``, its ``top`` entry for the ``pixels`` type
        included)."""
        return {
            ACTION: ACTION,
            "agent_pos": OBS_STATE,
            "top": f"{OBS_IMAGE}.top",
            "pixels/top": f"{OBS_IMAGES}.top",
        }


ENV_TYPES: dict[str, type[EnvConfig]] = {
    PushtEnvConfig.type: PushtEnvConfig,
    AlohaEnvConfig.type: AlohaEnvConfig,
}


def env_class(env_type: Any) -> type[EnvConfig]:
    """The config class of ``--env.type=env_type``; an unknown type is one line naming the known ones
    (ValueError, as every config validator here raises)."""
    cls = ENV_TYPES.get(env_type) if isinstance(env_type, str) else None
    if cls is None:
        raise ValueError(f"--env.type: invalid choice {env_type!r} (choose from {', '.join(ENV_TYPES)})")
    return cls


def env_config(env_type: str, **fields: Any) -> EnvConfig:
    """The config of ``--env.type=env_type`` with ``fields`` set."""
    return env_class(env_type)(**fields)
