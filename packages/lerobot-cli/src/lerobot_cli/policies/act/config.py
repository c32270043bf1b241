"""ACT (Action Chunking Transformer) config: LeRobot's ``ACTConfig`` field for field, torch-free.

Field names and defaults equal LeRobot's so that a ``config.json`` written by either side loads in the
other, ``pretrained_backbone_weights`` included: LeRobot's ImageNet ResNet18
(``"ResNet18_Weights.IMAGENET1K_V1"``), from the torch hub cache or downloaded into it as torchvision
does (``policies/backbone_weights.py``). It may also name a local weights file (a torchvision ResNet
state dict, ``.pth``/``.pt``/``.safetensors``), or be ``null`` for a randomly initialised backbone.
"""

from __future__ import annotations

from typing import ClassVar

from attrs import define

from lerobot_cli.optim.config import OptimizerConfig
from lerobot_cli.policies.backbone_weights import DEFAULT_BACKBONE_WEIGHTS
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.spec import PolicySpec

SUPPORTED_BACKBONES = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
FEEDFORWARD_ACTIVATIONS = ("relu", "gelu")
GRAD_CLIP_NORM = 10.0  # LeRobot's AdamW preset clips at 10; ACT has no field for it.


@define(frozen=True, kw_only=True)
class ACTConfig(PolicyConfig):
    type: ClassVar[str] = "act"
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="lerobot_cli.policies.act.modeling:ACTPolicy",
        in_lerobot=True,
        # One FSDP unit per transformer block; the backbone, projections and heads stay in the root unit.
        wrap_units=("ACTEncoderLayer", "ACTDecoderLayer"),
        # The feed-forward projections of every transformer block (VAE encoder, encoder, decoder). The
        # attention projections are not nn.Linear calls (nn.MultiheadAttention reads its weights directly),
        # so LoRA could not adapt them there.
        peft_targets=r"model\.(vae_encoder|encoder|decoder)\.layers\.\d+\.(linear1|linear2)",
        # Only decides how fresh weights are initialised: loading a pretrained policy clears it, since its
        # weights come from model.safetensors (and the init file may not exist there).
        init_only_fields=("pretrained_backbone_weights",),
    )

    # Input / output structure.
    chunk_size: int = 100
    n_action_steps: int = 100

    # Vision backbone.
    vision_backbone: str = "resnet18"
    pretrained_backbone_weights: str | None = DEFAULT_BACKBONE_WEIGHTS
    replace_final_stride_with_dilation: bool = False
    # Transformer.
    pre_norm: bool = False
    dim_model: int = 512
    n_heads: int = 8
    dim_feedforward: int = 3200
    feedforward_activation: str = "relu"
    n_encoder_layers: int = 4
    # LeRobot keeps 1 decoder layer: the original ACT code built 7 but only used the first.
    n_decoder_layers: int = 1
    # VAE.
    use_vae: bool = True
    latent_dim: int = 32
    n_vae_encoder_layers: int = 4

    # Inference.
    temporal_ensemble_coeff: float | None = None

    # Training and loss.
    dropout: float = 0.1
    kl_weight: float = 10.0

    # Optimizer preset.
    optimizer_lr: float = 1e-5
    optimizer_weight_decay: float = 1e-4
    optimizer_lr_backbone: float = 1e-5

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for name in (
            "chunk_size",
            "n_action_steps",
            "dim_model",
            "n_heads",
            "dim_feedforward",
            "n_encoder_layers",
            "n_decoder_layers",
            "latent_dim",
        ):
            _require_positive_int(name, getattr(self, name))
        if self.use_vae:
            _require_positive_int("n_vae_encoder_layers", self.n_vae_encoder_layers)
        if self.vision_backbone not in SUPPORTED_BACKBONES:
            raise ValueError(
                f"--policy.vision_backbone: invalid choice {self.vision_backbone!r} "
                f"(choose from {', '.join(SUPPORTED_BACKBONES)})"
            )
        if self.replace_final_stride_with_dilation and self.vision_backbone in ("resnet18", "resnet34"):
            raise ValueError(
                "--policy.replace_final_stride_with_dilation needs a bottleneck ResNet (resnet50 or larger); "
                f"{self.vision_backbone} has basic blocks, which do not support dilation"
            )
        if self.feedforward_activation not in FEEDFORWARD_ACTIVATIONS:
            raise ValueError(
                f"--policy.feedforward_activation: invalid choice {self.feedforward_activation!r} "
                f"(choose from {', '.join(FEEDFORWARD_ACTIVATIONS)})"
            )
        if self.dim_model % self.n_heads:
            raise ValueError(
                f"--policy.dim_model ({self.dim_model}) "
                f"must be divisible by --policy.n_heads ({self.n_heads})"
            )
        if self.dim_model % 4:
            # The 2-D camera position embedding gives dim_model/2 channels per axis, interleaving sin/cos.
            raise ValueError(f"--policy.dim_model must be a multiple of 4, got {self.dim_model}")
        if self.n_action_steps > self.chunk_size:
            raise ValueError(
                f"--policy.n_action_steps ({self.n_action_steps}) must be ≤ --policy.chunk_size "
                f"({self.chunk_size}): a model call predicts chunk_size actions"
            )
        if self.temporal_ensemble_coeff is not None and self.n_action_steps != 1:
            raise ValueError(
                "--policy.n_action_steps must be 1 with --policy.temporal_ensemble_coeff: temporal "
                f"ensembling queries the policy at every step (got n_action_steps={self.n_action_steps})"
            )
        if self.n_obs_steps != 1:
            raise ValueError(f"--policy.n_obs_steps must be 1 for ACT (got {self.n_obs_steps})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--policy.dropout must be in [0, 1), got {self.dropout!r}")
        for name in ("kl_weight", "optimizer_lr", "optimizer_weight_decay", "optimizer_lr_backbone"):
            if getattr(self, name) < 0:
                raise ValueError(f"--policy.{name} must be ≥ 0, got {getattr(self, name)!r}")

    def backbone_weights(self) -> str | None:
        return self.pretrained_backbone_weights

    def validate_features(self) -> None:
        """Checked when the policy is built, after the features were filled in from the dataset."""
        if not self.image_features and self.env_state_feature is None:
            raise ValueError(
                "ACT needs at least one camera (observation.images.*) or observation.environment_state "
                f"among its input features; got {sorted(self.input_features) or 'none'}"
            )
        if self.action_feature is None:
            raise ValueError(
                f"ACT needs an 'action' output feature; got {sorted(self.output_features) or 'none'}"
            )

    def eval_loss_description(self) -> str:
        if not self.use_vae:
            return super().eval_loss_description()
        return (
            "the L1 action loss alone (= eval/l1_loss): the training loss adds kl_weight "
            f"({self.kl_weight:g}) x the KL of the VAE encoder, which runs in training only (eval mode "
            "predicts from a zero latent), so compare eval/loss with the training l1_loss, "
            "not with the training loss"
        )

    def optimizer_preset(self) -> OptimizerConfig:
        return OptimizerConfig(
            type="adamw",
            lr=self.optimizer_lr,
            weight_decay=self.optimizer_weight_decay,
            grad_clip_norm=GRAD_CLIP_NORM,
        )

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.chunk_size))


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--policy.{name} must be an integer ≥ 1, got {value!r}")
