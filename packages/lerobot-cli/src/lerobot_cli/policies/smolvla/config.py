"""SmolVLA config: LeRobot 0.6.1's ``SmolVLAConfig`` field for field, torch-free.

Names and defaults equal LeRobot's, so a ``config.json`` written by either side loads in the other, and
no field of ours is missing from LeRobot's class (no ``config_extensions.json``). The VLM is
``vlm_model_name``'s ``config.json`` (a Hub id found in the Hugging Face cache, or a local directory: tests
write a tiny SmolVLM there), whose tokenizer the pre-processor loads too, as LeRobot's does.

``load_vlm_weights=true`` (``lerobot/smolvla_base``'s config.json has it) builds the VLM as LeRobot's
``from_pretrained(torch_dtype=bfloat16)`` does: the whole VLM and the action expert in bf16 (the expert's
replaced cross-attention ``k_proj``/``v_proj`` and the flow projections fp32), and a fresh policy starts
from ``vlm_model_name``'s weights (``model.safetensors``, or shards with an index; found offline like its
config), read for the first ``num_vlm_layers`` text layers only. With ``--policy.path`` or a resume the
checkpoint holds every tensor, so only the dtypes matter and the VLM's weights are not read
(``vlm_weights.py`` says why that gives LeRobot's values).

LeRobot fields this stack does not implement yet are kept so that LeRobot's files load, and refused
when set to anything but their off value: ignoring them would train something else than asked
(``add_image_special_tokens``, ``adapt_to_pi_aloha``, ``rtc_config``, ``compile_model``; ``use_cache=false``
crashes LeRobot's own cross-attention inference, and ``use_delta_joint_actions_aloha`` LeRobot refuses).
"""

from __future__ import annotations

from typing import Any, ClassVar

from attrs import define, field

from lerobot_cli.features import FeatureType, NormalizationMode, PolicyFeature, normalization_mapping
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.policies.common.presets import adamw_preset, cosine_decay_with_warmup_preset
from lerobot_cli.policies.common.rtc import check_rtc_config
from lerobot_cli.policies.config import InitialWeights, PolicyConfig, Source
from lerobot_cli.policies.spec import PolicySpec

SMOLVLM2_500M = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
# LeRobot's validate_features gives each empty camera this shape (it never reads it: the blank image
# takes the shape of the batch's resized cameras).
EMPTY_CAMERA_SHAPE = (3, 480, 640)


def _smolvla_normalization() -> dict[str, NormalizationMode]:
    return normalization_mapping(
        NormalizationMode.IDENTITY, NormalizationMode.MEAN_STD, NormalizationMode.MEAN_STD
    )


SMOLVLA_SPEC = PolicySpec(
    model="lerobot_cli.policies.smolvla.modeling:SmolVLAPolicy",
    processors="lerobot_cli.policies.smolvla.processors:smolvla_processor_steps",
    # The vision encoder's layers, and VLM text layer i with the expert layer paired with it as one unit:
    # the layer loop runs both in one call (SmolVLMLayer.joint: one joint attention, or the expert's
    # cross-attention to that VLM layer's keys and values). A VLM layer without an expert partner
    # (num_expert_layers < num_vlm_layers) is a SmolVLMSoloLayer, a unit of its own. The token embedding
    # is a unit (gathered only while it embeds), and so is the lm_head nothing reads (never gathered);
    # everything else (vision embeddings, connector, norms, the flow projections) is the root's.
    wrap_units=(
        "SmolVLMEncoderLayer",
        "SmolVLMTokenEmbedding",
        "SmolVLMLayer",
        "SmolExpertLayer",
        "SmolVLMSoloLayer",
        "UnusedLMHead",
    ),
    unit_groups=(("SmolVLMLayer", "SmolExpertLayer"),),
    # Modules whose forward never runs (LeRobot's layer loop calls their norms and projections directly)
    # must never be FSDP units.
    no_forward_modules=(
        "SmolVLAFlowModel",
        "SmolVLMWithExpertModel",
        "SmolVLMForConditionalGeneration",
        "SmolVLMModel",
        "LlamaModel",
        "LlamaDecoderLayer",
        "LlamaAttention",
    ),
    # LeRobot's default LoRA targets for SmolVLA: the expert's q/v projections and the projections.
    peft_targets=(
        r"(model\.vlm_with_expert\.lm_expert\..*\.(q|v)_proj|model\.(state_proj|action_in_proj|"
        r"action_out_proj|action_time_mlp_in|action_time_mlp_out))"
    ),
    in_lerobot=True,
    lerobot_extras=("smolvla",),  # LeRobot 0.6.1's SmolVLA needs its [smolvla] extra
    extras=("pi",),  # transformers: the SmolVLM and Llama classes, the SmolVLM tokenizer
)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--policy.{name} must be an integer ≥ 1, got {value!r}")


@define(frozen=True, kw_only=True)
class SmolVLAConfig(PolicyConfig):
    type: ClassVar[str] = "smolvla"
    spec: ClassVar[PolicySpec] = SMOLVLA_SPEC

    chunk_size: int = field(default=50, metadata={"help": "Actions predicted per chunk."})
    n_action_steps: int = field(default=50, metadata={"help": "Actions of a chunk executed (≤ chunk_size)."})
    normalization_mapping: dict[str, NormalizationMode] = field(
        factory=_smolvla_normalization, metadata={"help": "Normalization per feature type, as JSON."}
    )
    max_state_dim: int = field(default=32, metadata={"help": "State zero-padded to this many dimensions."})
    max_action_dim: int = field(default=32, metadata={"help": "Actions zero-padded to this many dimensions."})
    resize_imgs_with_padding: tuple[int, int] = field(
        default=(512, 512),
        converter=lambda v: v if v is None else tuple(v),
        metadata={"help": "Cameras resized keeping their aspect, padded left/top, to [width, height]."},
    )
    empty_cameras: int = field(
        default=0, metadata={"help": "Blank, masked cameras added (LeRobot's option)."}
    )
    adapt_to_pi_aloha: bool = field(default=False, metadata={"help": "LeRobot's Aloha conversion (refused)."})
    use_delta_joint_actions_aloha: bool = field(
        default=False, metadata={"help": "Refused, as LeRobot refuses it."}
    )
    tokenizer_max_length: int = field(default=48, metadata={"help": "Task tokens kept (truncation)."})
    num_steps: int = field(default=10, metadata={"help": "Euler steps of the flow at inference."})
    use_cache: bool = field(default=True, metadata={"help": "Prefix key/value cache at inference."})
    freeze_vision_encoder: bool = field(default=True, metadata={"help": "Freeze the SmolVLM vision tower."})
    train_expert_only: bool = field(default=True, metadata={"help": "Freeze the whole VLM."})
    train_state_proj: bool = field(default=True, metadata={"help": "Train the state projection."})

    optimizer_lr: float = 1e-4
    optimizer_betas: tuple[float, float] = field(default=(0.9, 0.95), converter=tuple)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 1e-10
    optimizer_grad_clip_norm: float = 10.0
    scheduler_warmup_steps: int = 1_000
    scheduler_decay_steps: int = 30_000
    scheduler_decay_lr: float = 2.5e-6

    vlm_model_name: str = field(
        default=SMOLVLM2_500M,
        metadata={
            "help": "SmolVLM whose config.json builds the VLM and whose tokenizer reads the task: "
            "a Hub id (from the cache, never downloaded by a run) or a local directory."
        },
    )
    load_vlm_weights: bool = field(
        default=False,
        metadata={
            "help": "Start from the VLM's pretrained weights (vlm_model_name's model.safetensors, from the "
            "cache or a local directory), with the VLM and the expert in bfloat16, as LeRobot."
        },
    )
    add_image_special_tokens: bool = field(
        default=False, metadata={"help": "Image special tokens around each camera (not supported yet)."}
    )
    attention_mode: str = field(
        default="cross_attn",
        metadata={
            "help": "'cross_attn' (the expert's odd layers read the VLM's keys/values) or any mode "
            "without 'cross' (joint self-attention in every layer), as LeRobot reads it."
        },
    )
    prefix_length: int = field(default=-1, metadata={"help": "Pad the prefix to this length (≤ 0: no)."})
    pad_language_to: str = field(
        default="longest", metadata={"help": "Tokenizer padding: longest or max_length."}
    )
    num_expert_layers: int = field(
        default=-1, metadata={"help": "Expert layers (≤ 0: as many as num_vlm_layers; else a divisor)."}
    )
    num_vlm_layers: int = field(default=16, metadata={"help": "First VLM text layers kept."})
    self_attn_every_n_layers: int = field(
        default=2, metadata={"help": "Every n-th layer is joint self-attention (cross_attn mode)."}
    )
    expert_width_multiplier: float = field(
        default=0.75, metadata={"help": "The action expert's hidden size over the VLM's."}
    )
    min_period: float = 4e-3
    max_period: float = 4.0
    rtc_config: dict[str, Any] | None = None
    compile_model: bool = False
    compile_mode: str = "max-autotune"

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for name in (
            "chunk_size",
            "n_action_steps",
            "max_state_dim",
            "max_action_dim",
            "num_steps",
            "tokenizer_max_length",
        ):
            _positive_int(name, getattr(self, name))
        # LeRobot's own check (its __post_init__), in its words' sense.
        if self.n_action_steps > self.chunk_size:
            raise ValueError(
                f"--policy.n_action_steps ({self.n_action_steps}) cannot be greater than "
                f"--policy.chunk_size ({self.chunk_size}): the chunk size is the upper bound for the "
                "number of action steps per model invocation"
            )
        if self.use_delta_joint_actions_aloha:
            raise ValueError(
                "--policy.use_delta_joint_actions_aloha=true is not ported in LeRobot (it refuses it too)"
            )
        if self.n_obs_steps != 1:
            raise ValueError(f"--policy.n_obs_steps must be 1 for smolvla (got {self.n_obs_steps})")
        size = self.resize_imgs_with_padding
        if (
            size is None
            or len(size) != 2
            or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.resize_imgs_with_padding
            )
        ):
            # LeRobot's parser refuses null too (its modeling would skip the resize)
            raise ValueError(
                f"--policy.resize_imgs_with_padding must be [width, height] of positive integers, "
                f"got {size if size is None else list(size)}"
            )
        if self.empty_cameras < 0:
            raise ValueError(f"--policy.empty_cameras must be ≥ 0, got {self.empty_cameras}")
        if self.pad_language_to not in ("longest", "max_length"):
            raise ValueError(
                f"--policy.pad_language_to: invalid choice {self.pad_language_to!r} (choose from longest, "
                "max_length)"
            )
        _positive_int("num_vlm_layers", self.num_vlm_layers)
        if self.num_expert_layers > 0 and self.num_vlm_layers % self.num_expert_layers:
            raise ValueError(
                f"--policy.num_vlm_layers ({self.num_vlm_layers}) must be a multiple of "
                f"--policy.num_expert_layers ({self.num_expert_layers})"
            )
        self._check_layer_pairing()
        if not self.expert_width_multiplier > 0:
            raise ValueError(
                f"--policy.expert_width_multiplier must be > 0, got {self.expert_width_multiplier}"
            )
        if not self.vlm_model_name:
            raise ValueError("--policy.vlm_model_name must name a SmolVLM (a Hub id or a local directory)")
        self._refuse_unsupported()

    def _check_layer_pairing(self) -> None:
        """With cross attention, an expert layer is built for one kind of attention (LeRobot gives the
        cross-attention ones, by expert index, k/v projections of the VLM's key/value width) but used by
        the VLM layer it is paired with, by VLM index: a mismatch fails in the first forward, in LeRobot
        too. Refused here instead."""
        if "cross" not in self.attention_mode:
            return
        n, vlm_layers = self.self_attn_every_n_layers, self.num_vlm_layers
        expert_layers = self.num_expert_layers if self.num_expert_layers > 0 else vlm_layers
        every = vlm_layers // expert_layers
        for i in range(0, vlm_layers, every):
            expert = i // every
            if (n > 0 and i % n == 0) != (n > 0 and expert % n == 0):
                raise ValueError(
                    f"--policy.num_expert_layers={self.num_expert_layers} with --policy.num_vlm_layers="
                    f"{vlm_layers} and --policy.self_attn_every_n_layers={n}: VLM layer {i} is a "
                    f"{'self' if n > 0 and i % n == 0 else 'cross'}-attention layer but its expert layer "
                    f"{expert} is built for the other kind (LeRobot fails on it in the first forward)"
                )

    def _refuse_unsupported(self) -> None:
        """LeRobot features this stack does not implement: on, they would be silently ignored."""
        refused = {
            "add_image_special_tokens": "image special tokens are not supported yet",
            "adapt_to_pi_aloha": "LeRobot's Aloha state/action conversion is not supported here",
            "compile_model": "torch.compile of the policy is not supported here; leave it false",
        }
        for name, why in refused.items():
            if getattr(self, name):
                raise ValueError(f"--policy.{name}=true: {why}")
        if not self.use_cache:
            raise ValueError(
                "--policy.use_cache=false is not supported (LeRobot's own cross-attention inference fails "
                "without the prefix cache); leave it true"
            )
        check_rtc_config(self.rtc_config)

    def validate_features(self) -> None:
        """Checked when the policy is built, after the features were filled in from the dataset."""
        if not self.image_features and self.empty_cameras == 0:
            raise ValueError(
                f"smolvla needs a camera, but the inputs have none ({sorted(self.input_features) or 'none'})"
            )
        if self.action_feature is None:
            raise ValueError(
                f"smolvla needs an 'action' output feature; got {sorted(self.output_features) or 'none'}"
            )
        if self.robot_state_feature is None:
            raise ValueError("smolvla needs an 'observation.state' input feature")
        for what, feature, limit in (
            ("state", self.robot_state_feature, self.max_state_dim),
            ("action", self.action_feature, self.max_action_dim),
        ):
            if feature.shape[-1] > limit:
                raise ValueError(
                    f"the {what} has {feature.shape[-1]} dimensions but --policy.max_{what}_dim is "
                    f"{limit}; raise --policy.max_{what}_dim to at least {feature.shape[-1]}"
                )

    def with_empty_cameras(self) -> dict[str, PolicyFeature]:
        """Input features plus LeRobot's ``empty_cameras`` placeholders (its validate_features adds them)."""
        extra = {
            key: PolicyFeature(FeatureType.VISUAL, EMPTY_CAMERA_SHAPE)
            for key in self.placeholder_inputs()
            if key not in self.input_features
        }
        return {**self.input_features, **extra}

    def placeholder_inputs(self) -> tuple[str, ...]:
        return tuple(f"observation.images.empty_camera_{i}" for i in range(self.empty_cameras))

    def tokenizer(self) -> Source | None:
        return Source("--policy.vlm_model_name", self.vlm_model_name)

    def external_sources(self) -> tuple[Source, ...]:
        from lerobot_cli.policies.smolvla.vlm import vlm_config_source

        sources = (vlm_config_source(self.vlm_model_name),)
        if self._reads_vlm_weights():
            from lerobot_cli.policies.smolvla.vlm_weights import vlm_weights_source

            sources += (vlm_weights_source(self.vlm_model_name),)
        return sources

    def _reads_vlm_weights(self) -> bool:
        """A fresh policy reads the VLM's weights; one from ``--policy.path`` (or a PEFT base) takes every
        tensor from that checkpoint instead (a resume does not ask: see ``build_policy``)."""
        return self.load_vlm_weights and not self.pretrained_path and not self.use_peft

    def initial_weights(self) -> InitialWeights | None:
        if not self._reads_vlm_weights():
            return None
        from lerobot_cli.policies.smolvla.vlm_weights import vlm_initial_weights

        return vlm_initial_weights(self)

    def optimizer_preset(self) -> OptimizerConfig:
        return adamw_preset(self)

    def scheduler_preset(self) -> SchedulerConfig:
        return cosine_decay_with_warmup_preset(self)

    @property
    def observation_delta_indices(self) -> list[int]:
        return [0]

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.chunk_size))
