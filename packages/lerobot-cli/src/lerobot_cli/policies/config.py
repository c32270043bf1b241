"""Base class of every policy config: the fields LeRobot's ``config.json`` carries for all policies.

Kept torch-free: the CLI parses and validates configs (and prints ``--help``) before torch loads.
A concrete policy subclasses this with ``@define(frozen=True, kw_only=True)``, sets the class
variables ``type`` (its registry name) and ``spec`` (its :class:`~lerobot_cli.policies.spec.PolicySpec`:
model class, processors, wrap units, PEFT targets, … named lazily), and may override the hooks below.
Every hook the runner calls is declared here with its default, so the runner never probes a config
for an optional attribute.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from attrs import define, field, frozen

from lerobot_cli.features import FeatureType, NormalizationMode, PolicyFeature, normalization_mapping
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.policies.spec import PolicySpec

if TYPE_CHECKING:  # torch-free at run time
    from torch import nn

    from lerobot_cli.policies.training_run import TrainingRun


@frozen
class Source:
    """Something a policy reads from outside the run's dataset and checkpoints (a tokenizer, a frozen
    encoder, weights a fresh policy starts from), as its user named it: the ``flag`` that names it
    (``--policy.tokenizer_name``; "" when the policy fixes it and no flag can change it) and its ``value``
    (a Hub repo id or a local path). ``resolve``: the local path it is read from, found without any
    download, or a ``ValueError`` in one line naming ``flag`` and how to get it (None: read elsewhere,
    e.g. a tokenizer the processors load). Torch-free, so the check runs before any heavy work.
    ``initial``: only what a fresh policy starts from (``initial_weights``), not asked for on a resume,
    whose checkpoint replaces it (SmolVLA's VLM weights)."""

    flag: str
    value: str
    resolve: Callable[[], Path] | None = field(default=None, eq=False, repr=False)
    initial: bool = False


@frozen
class InitialWeights:
    """Where a fresh policy's weights start from, when the policy says (``PolicyConfig.initial_weights``):
    ``directory``, a ``pretrained_model/`` whose ``model.safetensors`` is loaded over the fresh weights
    (tensors it lacks or holds in other shapes stay fresh, named in one warning), or None (the fresh
    weights as built); ``note`` says which and why, in the run's banner. ``load``: instead of a
    ``directory``, a function that loads them into the built policy itself (SmolVLA's VLM weights, whose
    files are the VLM's own, not a policy's)."""

    note: str
    directory: Path | None = None
    load: Callable[[nn.Module], object] | None = field(default=None, eq=False, repr=False)


def _default_normalization() -> dict[str, NormalizationMode]:
    return normalization_mapping(
        NormalizationMode.MEAN_STD, NormalizationMode.MEAN_STD, NormalizationMode.MEAN_STD
    )


@define(frozen=True, kw_only=True)
class PolicyConfig:
    type: ClassVar[str] = ""
    spec: ClassVar[PolicySpec | None] = None  # required to register (see lerobot_cli.policies.registry)

    n_obs_steps: int = field(default=1, metadata={"help": "Observation frames the policy sees per step."})
    normalization_mapping: dict[str, NormalizationMode] = field(
        factory=_default_normalization, metadata={"help": "Normalization per feature type, as JSON."}
    )
    input_features: dict[str, PolicyFeature] = field(
        factory=dict, metadata={"help": "Inputs (default: taken from the dataset)."}
    )
    output_features: dict[str, PolicyFeature] = field(
        factory=dict, metadata={"help": "Outputs (default: taken from the dataset)."}
    )
    device: str | None = field(
        default=None, metadata={"help": "cpu, cuda, … (default: cuda:LOCAL_RANK if present, else cpu)."}
    )
    use_amp: bool = field(
        default=False,
        metadata={"help": "LeRobot field kept for compatibility; use --accelerator.mixed_precision."},
    )
    push_to_hub: bool = field(
        default=True, metadata={"help": "Publish the final policy when --policy.repo_id is set."}
    )
    repo_id: str | None = field(
        default=None, metadata={"help": "Hub model repo the final policy is published to."}
    )
    private: bool | None = field(default=None, metadata={"help": "Create the Hub repo private."})
    tags: list[str] | None = field(default=None, metadata={"help": "Hub model card tags."})
    license: str | None = field(default=None, metadata={"help": "Hub model card license."})
    pretrained_path: str | None = field(
        default=None, metadata={"help": "Set by --policy.path: where weights load from."}
    )
    pretrained_revision: str | None = field(
        default=None,
        metadata={"help": "LeRobot's record of the Hub revision --policy.path named (kept as read)."},
    )
    use_peft: bool = field(
        default=False,
        metadata={
            "help": "Written true into a PEFT run's config.json (LeRobot's marker that the directory is an "
            "adapter); PEFT runs are chosen with --peft.*, not with this."
        },
    )

    def __attrs_post_init__(self) -> None:
        if self.n_obs_steps < 1:
            raise ValueError(f"--policy.n_obs_steps must be ≥ 1, got {self.n_obs_steps}")

    def eval_loss_description(self) -> str:
        """What ``eval/loss`` is for this policy (said in the banner of a run with ``--eval_steps``): the
        training loss unless a policy says otherwise (ACT: its KL term needs the training-only encoder).
        A hook, not a ``PolicySpec`` field, because the answer depends on the config's values (ACT's on
        ``use_vae`` and ``kl_weight``)."""
        return "the training loss and its parts, computed in eval mode (no dropout)"

    # Presets: what a run uses unless --optimizer.* / --scheduler.* say otherwise.
    def optimizer_preset(self) -> OptimizerConfig:
        return OptimizerConfig()

    def scheduler_preset(self) -> SchedulerConfig | None:
        return None

    # Which frames around the current one each batch needs (LeRobot's delta-index protocol).
    @property
    def observation_delta_indices(self) -> list[int] | None:
        return None

    @property
    def action_delta_indices(self) -> list[int] | None:
        return None

    @property
    def reward_delta_indices(self) -> list[int] | None:
        return None

    def placeholder_inputs(self) -> tuple[str, ...]:
        """Input features the policy fills in itself when a batch lacks them, so a dataset need not have
        them (pi0/pi05: LeRobot's empty-camera placeholders); none by default."""
        return ()

    def fit_dataset(self, dataset_features: dict[str, dict]) -> PolicyConfig:
        """This config on a dataset (``meta/info.json``'s raw ``features``), after the empty input/output
        features were filled from it: LeRobot's ``set_dataset_feature_metadata`` hook, for a policy whose
        features are not the dataset's as they are (FastWAM: each camera at its share of the image width).
        Unchanged by default."""
        return self

    def validate_features(self) -> None:
        """Refuse inputs/outputs the policy cannot use (cameras, state, action, image sizes) with a
        ``ValueError`` saying which flag or dataset to change; nothing to check by default."""

    def frames_dropped_per_episode(self) -> int:
        """How many last frames of each episode never start a training sample (diffusion's
        ``drop_n_last_frames``, applied by the sampler as LeRobot's is); 0 by default."""
        return 0

    def activation_checkpointing(self) -> str | None:
        """The flag of the policy's own switch (LeRobot's ``gradient_checkpointing``, FastWAM's
        ``use_gradient_checkpointing``) when it asks for activation checkpointing, read as
        ``--accelerator.activation_checkpointing.mode=full``; None when it does not (the default). The flag
        name lets a refusal say which switch to turn off."""
        return None

    def tokenizer(self) -> Source | None:
        """The tokenizer the processors or the model load (a Hub repo or a directory) and the flag naming
        it: a directory whose files name their own Python code is refused before any work, in a line
        naming that flag; None by default."""
        return None

    def external_sources(self) -> tuple[Source, ...]:
        """What the policy reads from outside the run's dataset and checkpoints and never downloads
        (frozen encoders, weights a fresh policy starts from), each resolved before any heavy work: one
        that is not there ends the run in its ``resolve()``'s line (exit 2), not in a traceback on every
        rank. On a resume the spec's ``init_only_fields`` are cleared before asking (what they initialise
        is not read then); ``--dry_run`` checks none. Empty by default."""
        return ()

    def initial_weights(self) -> InitialWeights | None:
        """Weights a fresh policy starts from beyond its own initialisation (FastWAM: its base model),
        loaded when the policy is built and said in the banner; never read when weights come from a
        checkpoint (the spec's ``init_only_fields`` are cleared then). None by default."""
        return None

    def prepare_training(self, policy: nn.Module, run: TrainingRun) -> list[str]:
        """Once per training run, on every rank, after ``policy`` is built (weights loaded; under PEFT the
        wrapper) and before it is wrapped or sharded: work cheaper done once than per batch (FastWAM's
        precomputed task contexts). Returns lines for the main rank's banner. Nothing by default."""
        return []

    def dry_run_notes(self) -> list[str]:
        """Lines ``--dry_run`` prints after the plan about what the plan's per-rank estimate leaves out
        (FastWAM: its frozen VAE and text encoder, on every rank beside the shards); none by default."""
        return []

    def backbone_weights(self) -> str | None:
        """The pretrained backbone file a fresh policy with cameras initialises from (downloaded once per
        machine before the run starts); None by default."""
        return None

    def features_of(self, kind: FeatureType) -> dict[str, PolicyFeature]:
        return {k: f for k, f in {**self.input_features, **self.output_features}.items() if f.type == kind}

    @property
    def image_features(self) -> dict[str, PolicyFeature]:
        return {k: f for k, f in self.input_features.items() if f.type == FeatureType.VISUAL}

    @property
    def robot_state_feature(self) -> PolicyFeature | None:
        return next((f for f in self.input_features.values() if f.type == FeatureType.STATE), None)

    @property
    def env_state_feature(self) -> PolicyFeature | None:
        return next((f for f in self.input_features.values() if f.type == FeatureType.ENV), None)

    @property
    def action_feature(self) -> PolicyFeature | None:
        return next((f for f in self.output_features.values() if f.type == FeatureType.ACTION), None)
