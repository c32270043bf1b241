"""Every file and directory name of a checkpoint, in one place.

Nothing else in the package spells a file name: other modules ask :class:`CheckpointPaths`. The
names are fixed by the user-facing layout (and by LeRobot's and accelerate's, for interoperability),
so changing one here is a format change. Torch-free on purpose: the CLI resolves paths before it
imports torch.

``<output_dir>/checkpoints/<step>/pretrained_model/…`` and ``…/training_state/…``, plus
``checkpoints/last -> <step>``. A run with an EMA adds ``…/pretrained_model_ema/``, the same files
with the EMA weights (:attr:`CheckpointPaths.ema` names them). Names starting with a dot inside
``checkpoints/`` are transient (staging directories, a symlink being swapped) and never a checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path

from attrs import define, field

CHECKPOINTS_DIR = "checkpoints"
RUN_LOCK = ".lerobot-run.lock"  # in <output_dir>/: the run holding the directory (see commit/run_lock.py)
ABANDONED_DIR = "abandoned"  # in <output_dir>/: checkpoints (and metrics) a resume set aside, never deleted
LAST_LINK = "last"
PRETRAINED_MODEL_DIR = "pretrained_model"
EMA_PRETRAINED_MODEL_DIR = (
    "pretrained_model_ema"  # LeRobot's: the EMA weights, loadable like pretrained_model/
)
TRAINING_STATE_DIR = "training_state"

# pretrained_model/
POLICY_CONFIG = "config.json"  # LeRobot's: only fields its config class has, so its parser accepts the file
# Our policy settings LeRobot's config class lacks (pi0's vision_variant, tokenizer_name): a sidecar beside
# config.json, read by lerobot_cli and ignored by LeRobot (it opens config.json alone).
POLICY_CONFIG_EXTENSIONS = "config_extensions.json"
TRAIN_CONFIG = "train_config.json"
MODEL_WEIGHTS = "model.safetensors"
MODEL_DCP_DIR = "pytorch_model_fsdp_0"  # accelerate's name, so its merge tool reads our shards
PREPROCESSOR_CONFIG = "policy_preprocessor.json"
PREPROCESSOR_STATE_GLOB = "policy_preprocessor_step_*.safetensors"
POSTPROCESSOR_CONFIG = "policy_postprocessor.json"
POSTPROCESSOR_STATE_GLOB = "policy_postprocessor_step_*.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's names
ADAPTER_CONFIG = "adapter_config.json"
MODEL_CARD = "README.md"  # the Hub's model card, written by lerobot-convert-dcp --push_to_hub when absent

# training_state/
OPTIMIZER_PARAM_GROUPS = "optimizer_param_groups.json"
OPTIMIZER_STATE = "optimizer_state.safetensors"
OPTIMIZER_DCP_DIR = "optimizer_0"  # accelerate's name
RNG_STATE = "rng_state.safetensors"
SCHEDULER_STATE = "scheduler_state.json"
SCALER_STATE = "scaler_state.json"
TRAINING_STEP = "training_step.json"

# transient names inside checkpoints/ (always dot-prefixed so listings and humans skip them)
STAGING_PREFIX = ".tmp-"
LINK_STAGING_PREFIX = ".last-tmp-"
ASIDE_PREFIX = ".old-"
TRANSIENT_PREFIXES = (STAGING_PREFIX, LINK_STAGING_PREFIX, ASIDE_PREFIX)

STEP_DIGITS = 6
_STEP_NAME = re.compile(rf"^[0-9]{{{STEP_DIGITS},}}$")


def step_dir_name(step: int) -> str:
    """Six digits so that ``ls`` sorts checkpoints; wider past 999999 rather than wrapping."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"a checkpoint step must be an integer ≥ 0, got {step!r}")
    return f"{step:0{STEP_DIGITS}d}"


def parse_step_dir_name(name: str) -> int | None:
    """The step a directory name stands for, or None for anything that is not a step directory."""
    return int(name) if _STEP_NAME.match(name) else None


def checkpoints_dir(output_dir: Path | str) -> Path:
    return Path(output_dir) / CHECKPOINTS_DIR


def staging_dir_name(step: int, pid: int) -> str:
    return f"{STAGING_PREFIX}{step_dir_name(step)}-{pid}"


def aside_dir_name(step: int, pid: int) -> str:
    return f"{ASIDE_PREFIX}{step_dir_name(step)}-{pid}"


def link_staging_name(pid: int) -> str:
    return f"{LINK_STAGING_PREFIX}{pid}"


def is_transient_name(name: str) -> bool:
    """Leftovers of an interrupted save: ignored by readers, removed by the next save."""
    return name.startswith(TRANSIENT_PREFIXES)


def _path(value: Path | str) -> Path:
    return Path(value)


@define(frozen=True)
class CheckpointPaths:
    """The paths inside one step directory (or inside its staging twin while it is being written)."""

    root: Path = field(converter=_path)
    # The weights directory these paths name: pretrained_model/, or pretrained_model_ema/ (see ``ema``).
    pretrained_name: str = field(default=PRETRAINED_MODEL_DIR, kw_only=True)

    @property
    def pretrained_model(self) -> Path:
        return self.root / self.pretrained_name

    @property
    def ema(self) -> CheckpointPaths:
        """The same step directory with ``pretrained_model_ema/`` as its weights directory: every
        ``pretrained_model/`` name below then points into it (``training_state/`` is shared)."""
        return CheckpointPaths(self.root, pretrained_name=EMA_PRETRAINED_MODEL_DIR)

    @property
    def pretrained_model_ema(self) -> Path:
        return self.ema.pretrained_model

    @property
    def training_state(self) -> Path:
        return self.root / TRAINING_STATE_DIR

    # pretrained_model/
    @property
    def policy_config(self) -> Path:
        return self.pretrained_model / POLICY_CONFIG

    @property
    def policy_config_extensions(self) -> Path:
        return self.pretrained_model / POLICY_CONFIG_EXTENSIONS

    @property
    def train_config(self) -> Path:
        return self.pretrained_model / TRAIN_CONFIG

    @property
    def model_weights(self) -> Path:
        return self.pretrained_model / MODEL_WEIGHTS

    @property
    def model_dcp(self) -> Path:
        return self.pretrained_model / MODEL_DCP_DIR

    @property
    def preprocessor_config(self) -> Path:
        return self.pretrained_model / PREPROCESSOR_CONFIG

    @property
    def postprocessor_config(self) -> Path:
        return self.pretrained_model / POSTPROCESSOR_CONFIG

    def processor_state_files(self) -> list[Path]:
        """Stateful processor steps' tensors (pre- then post-processor), as they exist on disk."""
        pm = self.pretrained_model
        return sorted(pm.glob(PREPROCESSOR_STATE_GLOB)) + sorted(pm.glob(POSTPROCESSOR_STATE_GLOB))

    @property
    def adapter_weights(self) -> Path:
        return self.pretrained_model / ADAPTER_WEIGHTS

    @property
    def adapter_config(self) -> Path:
        return self.pretrained_model / ADAPTER_CONFIG

    @property
    def model_card(self) -> Path:
        return self.pretrained_model / MODEL_CARD

    # training_state/
    @property
    def optimizer_param_groups(self) -> Path:
        return self.training_state / OPTIMIZER_PARAM_GROUPS

    @property
    def optimizer_state(self) -> Path:
        return self.training_state / OPTIMIZER_STATE

    @property
    def optimizer_dcp(self) -> Path:
        return self.training_state / OPTIMIZER_DCP_DIR

    @property
    def rng_state(self) -> Path:
        return self.training_state / RNG_STATE

    @property
    def scheduler_state(self) -> Path:
        return self.training_state / SCHEDULER_STATE

    @property
    def scaler_state(self) -> Path:
        return self.training_state / SCALER_STATE

    @property
    def training_step(self) -> Path:
        return self.training_state / TRAINING_STEP

    @property
    def step_from_name(self) -> int | None:
        return parse_step_dir_name(self.root.name)
