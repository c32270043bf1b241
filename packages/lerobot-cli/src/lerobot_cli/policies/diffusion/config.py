"""Diffusion Policy config: LeRobot 0.6.1's ``DiffusionConfig`` field for field, torch-free.

Names and defaults equal LeRobot's, so a ``config.json`` written by either side loads in the other
(``pretrained_backbone_weights`` included: LeRobot's ImageNet ResNet18 by default, from the torch hub
cache or downloaded into it as torchvision does; pass ``null`` for a random backbone or a local
weights file; see ``policies/backbone_weights.py``). As in LeRobot,
``resize_shape`` with ``crop_ratio < 1`` derives ``crop_shape`` when the config is made, so the derived
value is what ``config.json`` records.

Two of LeRobot's fields map onto this stack's own mechanisms: ``gradient_checkpointing=true`` becomes
``--accelerator.activation_checkpointing.mode=full`` over the wrap units (the U-Net's residual blocks,
exactly the modules LeRobot checkpoints), and ``compile_model`` is refused (``--accelerator.compile.*``
compiles here). The LR schedule preset is LeRobot's diffusers ``cosine`` (or ``constant_with_warmup``)
mapped onto this stack's schedules; see ``scheduler_preset``.
"""

from __future__ import annotations

from typing import ClassVar

from attrs import define, field

from lerobot_cli.features import NormalizationMode, normalization_mapping
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.policies.backbone_weights import DEFAULT_BACKBONE_WEIGHTS
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.spec import PolicySpec

SUPPORTED_BACKBONES = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
PREDICTION_TYPES = ("epsilon", "sample")

NOISE_SCHEDULERS = ("DDPM", "DDIM")
BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
LR_SCHEDULERS = ("cosine", "constant_with_warmup")
GRAD_CLIP_NORM = 10.0  # LeRobot's AdamConfig default; DiffusionConfig has no field for it.
FINAL_CONV_GROUPS = 8  # LeRobot's U-Net head uses GroupNorm(8, down_dims[0]) whatever n_groups says


def _diffusion_normalization() -> dict[str, NormalizationMode]:
    return normalization_mapping(
        NormalizationMode.MEAN_STD, NormalizationMode.MIN_MAX, NormalizationMode.MIN_MAX
    )


def _optional_pair(value):
    return None if value is None else tuple(value)


@define(frozen=True, kw_only=True)
class DiffusionConfig(PolicyConfig):
    type: ClassVar[str] = "diffusion"
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="lerobot_cli.policies.diffusion.modeling:DiffusionPolicy",
        in_lerobot=True,
        lerobot_extras=("diffusion",),  # LeRobot's DiffusionPolicy needs diffusers' schedulers
        # Every U-Net residual block (the bulk of the parameters: 2048-channel stages hold most of the 263M)
        # and every camera encoder (a ResNet each); the timestep MLP, the down/up-sampling convolutions and
        # the head stay in the root unit. With gradient_checkpointing the residual blocks are also what is
        # recomputed, as in LeRobot.
        wrap_units=("DiffusionConditionalResidualBlock1d", "DiffusionRgbEncoder"),
        # Loading a pretrained policy clears it: its weights come from model.safetensors.
        init_only_fields=("pretrained_backbone_weights",),
    )

    # Inputs / output structure.
    n_obs_steps: int = field(
        default=2, metadata={"help": "Observation frames (the current one and the ones before)."}
    )
    horizon: int = field(
        default=64, metadata={"help": "Actions the U-Net denoises per call (from the first observation)."}
    )
    n_action_steps: int = field(
        default=32, metadata={"help": "Actions executed per call (from the current step)."}
    )
    normalization_mapping: dict[str, NormalizationMode] = field(
        factory=_diffusion_normalization, metadata={"help": "Normalization per feature type, as JSON."}
    )
    drop_n_last_frames: int = field(
        default=7,
        metadata={
            "help": (
                "The last N frames of each episode never start a training sample (dropped by the sampler, "
                "as LeRobot's is; the held-out eval keeps them)."
            )
        },
    )

    # Vision backbone.
    vision_backbone: str = "resnet18"
    resize_shape: tuple[int, int] | None = field(default=None, converter=_optional_pair)
    crop_ratio: float = 1.0
    crop_shape: tuple[int, int] | None = field(default=None, converter=_optional_pair)
    crop_is_random: bool = True
    pretrained_backbone_weights: str | None = field(
        default=DEFAULT_BACKBONE_WEIGHTS,
        metadata={
            "help": (
                "torchvision weights name (from the torch hub cache, downloaded when missing), "
                "a local file, or null (random)."
            )
        },
    )
    use_group_norm: bool = False
    spatial_softmax_num_keypoints: int = 32
    use_separate_rgb_encoder_per_camera: bool = True
    # U-Net.
    down_dims: tuple[int, ...] = field(default=(512, 1024, 2048), converter=tuple)
    kernel_size: int = 5
    n_groups: int = 8
    diffusion_step_embed_dim: int = 128
    use_film_scale_modulation: bool = True
    gradient_checkpointing: bool = False
    # Noise scheduler.
    noise_scheduler_type: str = "DDPM"
    num_train_timesteps: int = 100
    beta_schedule: str = "squaredcos_cap_v2"
    beta_start: float = 0.0001
    beta_end: float = 0.02
    prediction_type: str = "epsilon"
    clip_sample: bool = True
    clip_sample_range: float = 1.0

    # Inference.
    num_inference_steps: int | None = None

    # LeRobot's compile switch (refused when true: --accelerator.compile.* compiles here).
    compile_model: bool = False
    compile_mode: str = "reduce-overhead"

    # Loss.
    do_mask_loss_for_padding: bool = False

    # Training presets.
    optimizer_lr: float = 1e-4
    optimizer_betas: tuple[float, float] = field(default=(0.95, 0.999), converter=tuple)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 1e-6
    scheduler_name: str = "cosine"
    scheduler_warmup_steps: int = 500

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for name in (
            "horizon",
            "n_action_steps",
            "spatial_softmax_num_keypoints",
            "kernel_size",
            "n_groups",
            "diffusion_step_embed_dim",
            "num_train_timesteps",
        ):
            _require_positive_int(name, getattr(self, name))
        _choice("vision_backbone", self.vision_backbone, SUPPORTED_BACKBONES)
        _choice("prediction_type", self.prediction_type, PREDICTION_TYPES)
        _choice("noise_scheduler_type", self.noise_scheduler_type, NOISE_SCHEDULERS)
        _choice("beta_schedule", self.beta_schedule, BETA_SCHEDULES)
        _choice("scheduler_name", self.scheduler_name, LR_SCHEDULERS)
        if (
            isinstance(self.drop_n_last_frames, bool)
            or not isinstance(self.drop_n_last_frames, int)
            or self.drop_n_last_frames < 0
        ):
            raise ValueError(
                f"--policy.drop_n_last_frames must be an integer ≥ 0, got {self.drop_n_last_frames!r}"
            )
        if self.resize_shape is not None and (
            len(self.resize_shape) != 2 or any(d <= 0 for d in self.resize_shape)
        ):
            raise ValueError(
                f"--policy.resize_shape must be two positive integers [H, W], got {list(self.resize_shape)}"
            )
        if not 0 < self.crop_ratio <= 1.0:
            raise ValueError(f"--policy.crop_ratio must be in (0, 1], got {self.crop_ratio!r}")
        if self.resize_shape is not None:
            # LeRobot's rule: with a resize, crop_ratio alone decides the crop (1.0: none).
            crop = (
                None
                if self.crop_ratio >= 1.0
                else (
                    int(self.resize_shape[0] * self.crop_ratio),
                    int(self.resize_shape[1] * self.crop_ratio),
                )
            )
            object.__setattr__(self, "crop_shape", crop)
        if self.crop_shape is not None and (
            len(self.crop_shape) != 2 or any(d <= 0 for d in self.crop_shape)
        ):
            raise ValueError(
                f"--policy.crop_shape must be two positive integers [H, W], got {list(self.crop_shape)}"
            )
        if self.use_group_norm and self.pretrained_backbone_weights:
            raise ValueError(
                "--policy.use_group_norm=true replaces the backbone's batch norms, which would ruin "
                "pretrained weights; pass --policy.pretrained_backbone_weights=null with it (got "
                f"{self.pretrained_backbone_weights!r})"
            )
        if not self.down_dims or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in self.down_dims
        ):
            raise ValueError(
                f"--policy.down_dims must be a non-empty list of integers ≥ 1, got {list(self.down_dims)}"
            )
        bad = [d for d in self.down_dims if d % self.n_groups]
        if bad:
            raise ValueError(
                f"--policy.down_dims {list(self.down_dims)} must all be multiples of --policy.n_groups "
                f"({self.n_groups}): the U-Net's group norms split each stage's channels into n_groups"
            )
        if self.down_dims[0] % FINAL_CONV_GROUPS:
            raise ValueError(
                f"--policy.down_dims[0] must be a multiple of {FINAL_CONV_GROUPS} (the U-Net's last "
                f"block has {FINAL_CONV_GROUPS} group-norm groups), got {self.down_dims[0]}"
            )
        factor = 2 ** len(self.down_dims)
        if self.horizon % factor:
            raise ValueError(
                f"--policy.horizon ({self.horizon}) must be a multiple of 2**len(--policy.down_dims) = "
                f"{factor}: each U-Net stage halves the time axis"
            )
        if self.n_action_steps > self.horizon - self.n_obs_steps + 1:
            raise ValueError(
                f"--policy.n_action_steps ({self.n_action_steps}) must be ≤ horizon - n_obs_steps + 1 = "
                f"{self.horizon - self.n_obs_steps + 1}: "
                "the executed actions start at the current observation"
            )
        if self.kernel_size % 2 == 0:
            raise ValueError(
                f"--policy.kernel_size must be odd (same-length 1-D convolutions), got {self.kernel_size}"
            )
        if self.diffusion_step_embed_dim % 2 or self.diffusion_step_embed_dim < 4:
            raise ValueError(
                "--policy.diffusion_step_embed_dim must be an even integer ≥ 4 (half sines, half "
                f"cosines), got {self.diffusion_step_embed_dim}"
            )
        if self.num_inference_steps is not None:
            _require_positive_int("num_inference_steps", self.num_inference_steps)
            if self.num_inference_steps > self.num_train_timesteps:
                raise ValueError(
                    f"--policy.num_inference_steps ({self.num_inference_steps}) must be ≤ "
                    f"--policy.num_train_timesteps ({self.num_train_timesteps})"
                )
        for name in ("beta_start", "beta_end"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"--policy.{name} must be in (0, 1), got {getattr(self, name)!r}")
        if self.clip_sample_range <= 0:
            raise ValueError(f"--policy.clip_sample_range must be > 0, got {self.clip_sample_range!r}")
        if self.compile_model:
            raise ValueError(
                "--policy.compile_model=true is not supported here; leave it false and use "
                "--accelerator.compile.enabled=true"
            )
        if len(self.optimizer_betas) != 2 or not all(0 <= b < 1 for b in self.optimizer_betas):
            raise ValueError(
                f"--policy.optimizer_betas must be two numbers in [0, 1), got {list(self.optimizer_betas)}"
            )
        for name in ("optimizer_lr", "optimizer_eps", "optimizer_weight_decay", "scheduler_warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"--policy.{name} must be ≥ 0, got {getattr(self, name)!r}")

    def frames_dropped_per_episode(self) -> int:
        return self.drop_n_last_frames

    def activation_checkpointing(self) -> bool:
        return self.gradient_checkpointing

    def backbone_weights(self) -> str | None:
        return self.pretrained_backbone_weights

    def validate_features(self) -> None:
        """Checked when the policy is built, after the features were filled in from the dataset."""
        if not self.image_features and self.env_state_feature is None:
            raise ValueError(
                "diffusion needs at least one camera (observation.images.*) or "
                f"observation.environment_state among its inputs; got {sorted(self.input_features) or 'none'}"
            )
        if self.robot_state_feature is None:
            raise ValueError(
                "diffusion needs observation.state among its inputs; "
                f"got {sorted(self.input_features) or 'none'}"
            )
        if self.action_feature is None:
            raise ValueError(
                f"diffusion needs an 'action' output feature; got {sorted(self.output_features) or 'none'}"
            )
        shapes = {key: tuple(f.shape) for key, f in self.image_features.items()}
        if len(set(shapes.values())) > 1:
            raise ValueError(f"diffusion needs every camera at the same shape; got {shapes}")
        if self.resize_shape is None and self.crop_shape is not None:
            for key, shape in shapes.items():
                if self.crop_shape[0] > shape[1] or self.crop_shape[1] > shape[2]:
                    raise ValueError(
                        f"--policy.crop_shape {list(self.crop_shape)} does not fit inside {key} "
                        f"({shape[1]}x{shape[2]}): give at most [{shape[1]}, {shape[2]}], or null for "
                        "no crop"
                    )

    def optimizer_preset(self) -> OptimizerConfig:
        return OptimizerConfig(
            type="adam",
            lr=self.optimizer_lr,
            betas=self.optimizer_betas,
            eps=self.optimizer_eps,
            weight_decay=self.optimizer_weight_decay,
            grad_clip_norm=GRAD_CLIP_NORM,
        )

    def scheduler_preset(self) -> SchedulerConfig:
        """LeRobot's diffusers schedule by name, with diffusers' formula: ``constant_with_warmup``, and
        ``cosine`` as ``diffuser_cosine`` (warm-up from 0, then one half cosine from the warm-up end to 0
        at the last step; ``tools/interop/diffusion_lerobot_interop.py`` compares the values)."""
        kind = "constant_with_warmup" if self.scheduler_name == "constant_with_warmup" else "diffuser_cosine"
        return SchedulerConfig(
            type=kind, num_warmup_steps=self.scheduler_warmup_steps, peak_lr=self.optimizer_lr, decay_lr=0.0
        )

    @property
    def observation_delta_indices(self) -> list[int]:
        return list(range(1 - self.n_obs_steps, 1))

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(1 - self.n_obs_steps, 1 - self.n_obs_steps + self.horizon))


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"--policy.{name}: invalid choice {value!r} (choose from {', '.join(choices)})")


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--policy.{name} must be an integer ≥ 1, got {value!r}")
