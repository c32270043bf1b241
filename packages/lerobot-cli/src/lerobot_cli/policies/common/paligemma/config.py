"""The config pi0 and pi05 share: LeRobot 0.6.1's ``PI0Config`` field for field, torch-free.

LeRobot's ``PI05Config`` is its ``PI0Config`` with three defaults changed, so both policies subclass
``PiFlowConfig`` here (``policies/pi0/config.py``, ``policies/pi05/config.py``) and share one spec shape
(``paligemma_spec``).

Names and defaults equal LeRobot's, so a ``config.json`` written by either side loads in the other.
Two fields are ours: ``vision_variant`` (LeRobot always builds SigLIP so400m) and ``tokenizer_name``
(LeRobot's processor always names ``google/paligemma-3b-pt-224``). They are never written into
``config.json``, whose unknown keys LeRobot's parser refuses, but into ``config_extensions.json`` beside it
(``lerobot_extension_fields``, see ``policies.extensions``). ``gemma_tiny`` and ``vision_variant=tiny`` are
for tests and CPU demos; LeRobot refuses ``paligemma_variant=gemma_tiny`` in a ``config.json`` (it has no
such model), so a config using them is ours alone.

LeRobot fields this stack does not implement are kept so that LeRobot's files load, and refused
when set to anything but their off value: ignoring them would train something else than asked.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import define, field

from lerobot_cli.features import FeatureType, NormalizationMode, PolicyFeature, normalization_mapping
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.policies.common.paligemma.variants import (
    GEMMA_VARIANTS,
    LEROBOT_GEMMA_VARIANTS,
    VISION_VARIANTS,
)
from lerobot_cli.policies.common.presets import adamw_preset, cosine_decay_with_warmup_preset
from lerobot_cli.policies.common.rtc import check_rtc_config
from lerobot_cli.policies.config import PolicyConfig, Source
from lerobot_cli.policies.spec import PolicySpec

DTYPES = ("float32", "bfloat16")
PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"


def _pi0_normalization() -> dict[str, NormalizationMode]:
    return normalization_mapping(
        NormalizationMode.IDENTITY, NormalizationMode.MEAN_STD, NormalizationMode.MEAN_STD
    )


def _choice(name: str, value: str, choices) -> None:
    if value not in choices:
        raise ValueError(f"--policy.{name}: invalid choice {value!r} (choose from {', '.join(choices)})")


def paligemma_spec(model: str, processors: str) -> PolicySpec:
    """pi0's and pi05's spec: the same towers, FSDP units, LoRA targets and file adapter; each names its
    own policy class and processor steps."""
    return PolicySpec(
        model=model,
        processors=processors,
        # SigLIP layers and the embedding alone; each joint layer pair (VLM layer i, expert layer i) as
        # one unit.
        wrap_units=(
            "SiglipEncoderLayer",
            "GemmaTextScaledWordEmbedding",
            "UnusedHead",
            "PaliGemmaLayer",
            "ExpertLayer",
        ),
        unit_groups=(("PaliGemmaLayer", "ExpertLayer"),),
        # Modules whose forward never runs (their layers and methods are called directly): never FSDP units.
        no_forward_modules=(
            "PI0FlowModel",
            "PI05FlowModel",
            "PaliGemmaWithExpert",
            "PaliGemmaForConditionalGeneration",
            "PaliGemmaModel",
            "GemmaForCausalLM",
            "GemmaModel",
            "GemmaProjections",
        ),
        # LeRobot's default LoRA targets for pi0: the expert's q/v projections and the action/state
        # projections.
        peft_targets=(
            r"(.*\.gemma_expert\..*\.self_attn\.(q|v)_proj|model\.(state_proj|action_in_proj|action_out_proj|"
            r"action_time_mlp_in|action_time_mlp_out))"
        ),
        # Fields LeRobot's PI0Config/PI05Config lack: saved in config_extensions.json, never in config.json.
        extension_fields=("tokenizer_name", "vision_variant"),
        in_lerobot=True,
        lerobot_extras=("pi",),  # LeRobot 0.6.1's own pi0/pi05 need its [pi] extra
        extras=("pi",),  # transformers: PaliGemma, SigLIP and Gemma classes, the PaliGemma tokenizer
        # Files in the layouts LeRobot's from_pretrained also fixes (openpi's names, no model. prefix, …).
        state_dict_adapter="lerobot_cli.policies.common.paligemma.policy:adapt_state_dict",
        per_sample_loss=True,  # forward(batch, reduction="none"), as LeRobot's pi0 and pi05
    )


@define(frozen=True, kw_only=True)
class PiFlowConfig(PolicyConfig):
    """Fields pi0 and pi05 share (LeRobot keeps two copies of them; here they are written once)."""

    paligemma_variant: str = "gemma_2b"
    action_expert_variant: str = "gemma_300m"
    dtype: str = "float32"
    vision_variant: str = field(
        default="so400m", metadata={"help": "SigLIP tower: so400m (LeRobot's) or tiny (tests)."}
    )
    tokenizer_name: str = field(
        default=PALIGEMMA_TOKENIZER,
        metadata={"help": "Hub name or local directory of the PaliGemma tokenizer."},
    )

    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32

    # Flow matching (openpi's PI0Pytorch): time ~ Beta(alpha, beta) * scale + offset.
    num_inference_steps: int = 10
    time_sampling_beta_alpha: float = 1.5
    time_sampling_beta_beta: float = 1.0
    time_sampling_scale: float = 0.999
    time_sampling_offset: float = 0.001
    min_period: float = 4e-3
    max_period: float = 4.0

    # LeRobot features kept for file compatibility; only their off values are accepted
    # (see __attrs_post_init__).
    use_relative_actions: bool = False
    relative_exclude_joints: list[str] = field(factory=lambda: ["gripper"])
    action_feature_names: list[str] | None = None
    rtc_config: dict[str, Any] | None = None
    compile_model: bool = False
    compile_mode: str = "max-autotune"

    image_resolution: tuple[int, int] = field(default=(224, 224), converter=tuple)
    empty_cameras: int = 0
    normalization_mapping: dict[str, NormalizationMode] = field(factory=_pi0_normalization)

    gradient_checkpointing: bool = False
    freeze_vision_encoder: bool = False
    train_expert_only: bool = False

    optimizer_lr: float = 2.5e-5
    optimizer_betas: tuple[float, float] = field(default=(0.9, 0.95), converter=tuple)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 0.01
    optimizer_grad_clip_norm: float = 1.0
    scheduler_warmup_steps: int = 1_000
    scheduler_decay_steps: int = 30_000
    scheduler_decay_lr: float = 2.5e-6

    tokenizer_max_length: int = 48

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        _choice("paligemma_variant", self.paligemma_variant, tuple(GEMMA_VARIANTS))
        _choice("action_expert_variant", self.action_expert_variant, tuple(GEMMA_VARIANTS))
        _choice("vision_variant", self.vision_variant, tuple(VISION_VARIANTS))
        _choice("dtype", self.dtype, DTYPES)
        for name in (
            "chunk_size",
            "n_action_steps",
            "max_state_dim",
            "max_action_dim",
            "num_inference_steps",
            "tokenizer_max_length",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--policy.{name} must be an integer ≥ 1, got {value!r}")
        if self.n_action_steps > self.chunk_size:
            raise ValueError(
                f"--policy.n_action_steps ({self.n_action_steps}) cannot be greater than "
                f"--policy.chunk_size ({self.chunk_size})"
            )
        if self.n_obs_steps != 1:
            raise ValueError(f"--policy.n_obs_steps must be 1 for {self.type} (got {self.n_obs_steps})")
        if len(self.image_resolution) != 2 or self.image_resolution[0] != self.image_resolution[1]:
            raise ValueError(
                f"--policy.image_resolution must be square [N, N] (PaliGemma's SigLIP), "
                f"got {list(self.image_resolution)}"
            )
        patch = VISION_VARIANTS[self.vision_variant].patch_size
        side = self.image_resolution[0]
        # 0 and negative multiples pass a plain modulo test; a 0-patch image divided by zero at step 1.
        if isinstance(side, bool) or not isinstance(side, int) or side < patch or side % patch:
            raise ValueError(
                f"--policy.image_resolution must be [N, N] with N a positive multiple of the SigLIP "
                f"patch size {patch} (e.g. [{16 * patch}, {16 * patch}]), got {list(self.image_resolution)}"
            )
        if self.empty_cameras < 0:
            raise ValueError(f"--policy.empty_cameras must be ≥ 0, got {self.empty_cameras}")
        vlm, expert = GEMMA_VARIANTS[self.paligemma_variant], GEMMA_VARIANTS[self.action_expert_variant]
        if (vlm.num_heads, vlm.num_kv_heads, vlm.head_dim) != (
            expert.num_heads,
            expert.num_kv_heads,
            expert.head_dim,
        ):
            raise ValueError(
                f"--policy.paligemma_variant={self.paligemma_variant} and --policy.action_expert_variant="
                f"{self.action_expert_variant} have different attention heads; joint attention needs the "
                "same number of heads, key/value heads and head size in both towers"
            )
        if self.vision_variant != "so400m" and self.paligemma_variant in LEROBOT_GEMMA_VARIANTS:
            # vision_variant is not in config.json (LeRobot's class lacks it): LeRobot would read this config
            # as a so400m model, fail to load our weights into it and keep random ones (its pi0 loader only
            # warns). With gemma_tiny, LeRobot refuses the config.json by its paligemma_variant instead.
            raise ValueError(
                f"--policy.vision_variant={self.vision_variant} needs --policy.paligemma_variant=gemma_tiny "
                f"(got {self.paligemma_variant}): LeRobot's config.json has no vision_variant and would "
                "describe a full-size SigLIP"
            )
        self._refuse_unsupported()

    def _refuse_unsupported(self) -> None:
        """LeRobot features this stack does not implement: on, they would be silently ignored."""
        if self.use_relative_actions:
            raise ValueError(
                "--policy.use_relative_actions=true is not supported here (LeRobot's relative-action "
                "processors are not implemented); train with absolute actions"
            )
        if self.compile_model:
            raise ValueError("--policy.compile_model=true is not supported here; leave it false")
        check_rtc_config(self.rtc_config)

    def fit_dataset(self, dataset_features: dict[str, dict]) -> PiFlowConfig:
        """LeRobot's ``make_policy``: ``action_feature_names`` are the dataset's action names (whatever the
        config said), which the pre-processor's relative-actions step saves in its file."""
        names = (dataset_features.get("action") or {}).get("names")
        if names is None:
            return self
        return attrs.evolve(self, action_feature_names=list(names))

    def validate_features(self) -> None:
        """Checked when the policy is built, after the features were filled in from the dataset."""
        if not self.image_features and self.empty_cameras == 0:
            raise ValueError(
                f"{self.type} needs a camera, but the dataset has none (no observation.images.* among "
                f"its inputs {sorted(self.input_features) or 'none'}): pass --policy.empty_cameras=1 to "
                "train with a blank, masked camera image instead (LeRobot's option), or use a dataset "
                "with a camera"
            )
        if self.action_feature is None:
            raise ValueError(
                f"{self.type} needs an 'action' output feature; got {sorted(self.output_features) or 'none'}"
            )
        for what, feature, limit in (
            ("state", self.robot_state_feature, self.max_state_dim),
            ("action", self.action_feature, self.max_action_dim),
        ):
            if feature is not None and feature.shape[-1] > limit:
                raise ValueError(
                    f"the {what} has {feature.shape[-1]} dimensions but --policy.max_{what}_dim is "
                    f"{limit}; raise --policy.max_{what}_dim to at least {feature.shape[-1]}"
                )

    def activation_checkpointing(self) -> str | None:
        return "--policy.gradient_checkpointing" if self.gradient_checkpointing else None

    def tokenizer(self) -> Source | None:
        return Source("--policy.tokenizer_name", self.tokenizer_name) if self.tokenizer_name else None

    def with_empty_cameras(self) -> dict[str, PolicyFeature]:
        """Input features plus the ``empty_cameras`` placeholders LeRobot adds (all -1 images, masked out)."""
        extra = {
            key: PolicyFeature(FeatureType.VISUAL, (3, *self.image_resolution))
            for key in self.placeholder_inputs()
        }
        return {**self.input_features, **extra}

    def placeholder_inputs(self) -> tuple[str, ...]:
        """LeRobot's ``empty_cameras`` placeholders: its ``validate_features`` writes them into the
        ``input_features`` of the ``config.json`` it saves, no dataset has them, and the policy feeds a
        masked blank image for each (LeRobot's ``make_policy`` accepts such a checkpoint on its dataset)."""
        return tuple(f"observation.images.empty_camera_{i}" for i in range(self.empty_cameras))

    def optimizer_preset(self) -> OptimizerConfig:
        return adamw_preset(self)

    def scheduler_preset(self) -> SchedulerConfig:
        return cosine_decay_with_warmup_preset(self)

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.chunk_size))
