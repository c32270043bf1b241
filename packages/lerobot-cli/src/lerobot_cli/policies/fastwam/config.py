"""FastWAM config: LeRobot 0.6.1's ``FastWAMConfig`` field for field, torch-free.

Names, defaults and derived values equal LeRobot's, so a ``config.json`` written by either side loads
in the other: the two network configs (``video_dit_config``, ``action_dit_config``) default to the
Wan2.2-TI2V-5B video DiT and the 1 B action DiT with ``fp32_attention`` and ``use_gradient_checkpointing``
copied in from the top-level fields (``dit_configs.py`` holds the defaults, the tiny sizes and the checks
both pass), and a config without features gets LeRobot's synthetic ones (one
``observation.images.image`` camera at the full ``image_size``, ``observation.state`` of ``proprio_dim``
and ``action`` of ``action_dim``).
On a dataset, :meth:`FastWAMConfig.fit_dataset` does what LeRobot's ``make_policy`` does with
``set_dataset_feature_metadata``: every ``observation.images.*`` camera, sorted, at ``image_size[1] / n``
pixels wide (they are concatenated along the width into one video), and the dataset's action.

Three fields are ours, in ``config_extensions.json``, not ``config.json`` (whose unknown keys LeRobot 0.6.1's
parser refuses): ``compile_action_infer`` (LeRobot's main branch, after 0.6.1), ``precompute_task_contexts``
(``precompute.py``: each task's text context encoded once at the start of a training run, so no rank holds
UMT5 while it trains) and ``variant``.
``variant=tiny`` is for tests and CPU demos: the networks default to :func:`tiny_dit_configs` (explicit
``video_dit_config`` / ``action_dit_config`` still win) and the policy builds a tiny Wan2.2-shaped VAE and
UMT5 from config with fixed seeds instead of loading the real ones, so nothing but the tokenizer
(``tokenizer_model_id``, e.g. the bundled ``data/tokenizers/demo_bytes``) is read from disk. LeRobot has no
such variant: it reads the tiny networks from ``config.json`` but loads the real VAE and UMT5, whose
4096-wide context does not fit the tiny DiTs' ``text_dim``.

What is read from where (``PolicyConfig.external_sources``, each found offline before any work or one line
naming its flag and ``hf download``; ``sources.frozen_part_sources``): the Wan2.2 VAE always from
``Wan-AI/Wan2.2-TI2V-5B-Diffusers``'s ``vae/`` in the Hugging Face cache, as LeRobot 0.6.1 (no field moves
it); with ``load_text_encoder`` the UMT5 text encoder from ``text_encoder_model_id``'s ``text_encoder/`` and
its tokenizer from ``tokenizer_model_id`` (a Hub repo in the cache or a local directory, the tokenizer under
the custom-code refusal); without, neither: each batch must then carry its ``context`` / ``context_mask``,
and a dataset that has none is refused by :meth:`FastWAMConfig.fit_dataset`.

``base_model_id``: LeRobot points ``pretrained_path`` at ``lerobot/fastwam_base`` in ``__post_init__``
whenever the network sizes are the base's, and downloads it when the policy is built. Here
``pretrained_path`` stays what ``--policy.path`` says, and a fresh policy starts from the base's weights
through ``PolicyConfig.initial_weights`` (``base.py``: a local directory or the repo's snapshot in the Hugging
Face cache, LeRobot's cross-embodiment rule for tensors of other shapes, a base of another size judged by its
own ``config.json``). Being init-only, the field is written as ``null`` once the weights are the policy's own
(as LeRobot drops the automatic path).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, ClassVar

import attrs
from attrs import define, field

from lerobot_cli.errors import ConfigError
from lerobot_cli.features import (
    FeatureType,
    NormalizationMode,
    PolicyFeature,
    dataset_to_policy_features,
    normalization_mapping,
)
from lerobot_cli.optim.config import OptimizerConfig
from lerobot_cli.policies.config import InitialWeights, PolicyConfig, Source
from lerobot_cli.policies.fastwam.dit_configs import (
    check_action_dit,
    check_video_dit,
    default_action_dit_config,
    default_video_dit_config,
    require_positive_int,
    tiny_dit_configs,
)
from lerobot_cli.policies.spec import PolicySpec

WAN22_MODEL_ID = "Wan-AI/Wan2.2-TI2V-5B"
WAN22_DIFFUSERS_MODEL_ID = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
FASTWAM_BASE_MODEL_ID = "lerobot/fastwam_base"
WAN_T5_TOKENIZER_ID = "google/umt5-xxl"
DEFAULT_PROMPT_TEMPLATE = (
    "A video recorded from a robot's point of view executing the following instruction: {task}"
)
TORCH_DTYPES = ("float32", "float16", "bfloat16")
VARIANTS = ("full", "tiny")  # full: LeRobot's frozen VAE and UMT5, loaded; tiny: built from config (tests)
CAMERA_PREFIX = "observation.images."
# The Wan2.2 VAE's latent channels and spatial downsampling (vae.py), whatever the variant: the video DiT must
# read and write those latents.
WAN_VAE_LATENT_CHANNELS = 48
WAN_VAE_SPATIAL_FACTOR = 16
OBS_STATE = "observation.state"
VIDEO_KEY = "video"  # a batch may carry the stacked video itself (LeRobot's stack_video reads it first)
ACTION = "action"


def _fastwam_normalization() -> dict[str, NormalizationMode]:
    return normalization_mapping(
        NormalizationMode.IDENTITY, NormalizationMode.MEAN_STD, NormalizationMode.MEAN_STD
    )


def _schedule() -> dict[str, Any]:
    return {"train_shift": 5.0, "infer_shift": 5.0, "num_train_timesteps": 1000}


def _is_local_path(value: str) -> bool:
    """LeRobot's reading of a model id as a local path: absolute, ``./``, ``../``, ``~`` or existing."""
    path = Path(value)
    return path.expanduser().is_absolute() or value.startswith(("./", "../", "~")) or path.exists()


FASTWAM_SPEC = PolicySpec(
    model="lerobot_cli.policies.fastwam.modeling:FastWAMPolicy",
    # LeRobot's make_fastwam_pre_post_processors: the default lists plus the action-toggle post step
    processors="lerobot_cli.policies.fastwam.processors:fastwam_processor_steps",
    # Each MoTLayer owns video block i and action block i and is the only module whose forward runs them.
    wrap_units=("MoTLayer",),
    # Modules whose parts the model calls directly (the experts' embed/unembed, the MoT's prefill and cached
    # action passes, the core's predict; a block's open/close and its attention projections, inside
    # MoTLayer.forward; the video head's project): never FSDP units, or their parameters would not be
    # gathered there. The size rule (--accelerator.fsdp.min_num_params) passes over them too, so their
    # parameters count to the MoTLayer (or the root) that does run.
    no_forward_modules=(
        "FastWAMModel",
        "MoT",
        "VideoDiT",
        "ActionDiT",
        "DiTBlock",
        "Projections",
        "VideoHead",
    ),
    # LoRA on the action expert: every linear layer of its blocks (self- and cross-attention q/k/v/o, the
    # FFN). LeRobot's FastWAMPolicy defines no default targets; a LeRobot user passes the same regex as
    # --peft.target_modules.
    peft_targets=(
        r"model\.mot\.layers\.\d+\.blocks\.action\."
        r"(self_attn\.(q|k|v|o)|cross_attn\.(q|k|v|o)|ffn\.(0|2))"
    ),
    init_only_fields=("base_model_id",),
    extension_fields=("compile_action_infer", "precompute_task_contexts", "variant"),
    in_lerobot=True,
    lerobot_extras=("fastwam",),  # LeRobot 0.6.1's FastWAM needs its [fastwam] extra
    # diffusers (the Wan2.2 VAE) and transformers (UMT5 and its tokenizer), as lerobot[fastwam]
    extras=("fastwam",),
)


@define(frozen=True, kw_only=True)
class FastWAMConfig(PolicyConfig):
    """LeRobot 0.6.1's FastWAM settings (plus ``compile_action_infer`` and ``variant``); see the module
    docstring."""

    type: ClassVar[str] = "fastwam"
    spec: ClassVar[PolicySpec] = FASTWAM_SPEC

    action_dim: int = field(
        default=7, metadata={"help": "Action channels per step (the dataset's action width)."}
    )
    proprio_dim: int | None = field(
        default=8,
        metadata={
            "help": "observation.state width, encoded as one extra text-context token; null: no "
            "proprioception."
        },
    )
    action_horizon: int = field(default=32, metadata={"help": "Actions predicted per chunk."})
    n_action_steps: int = field(default=32, metadata={"help": "Actions executed per predicted chunk."})
    num_video_frames: int = field(
        default=33,
        metadata={
            "help": "Raw frame window of the video target; every action_video_freq_ratio-th frame is used."
        },
    )
    action_video_freq_ratio: int = field(default=4, metadata={"help": "Actions per video frame."})
    image_size: tuple[int, int] = field(
        default=(224, 448),
        converter=tuple,
        metadata={"help": "(height, width) of the camera images concatenated along the width."},
    )
    context_len: int = 128
    model_id: str = field(
        default=WAN22_MODEL_ID,
        metadata={
            "help": f"{WAN22_MODEL_ID} or a local path (LeRobot's base-creation source of the video DiT)."
        },
    )
    tokenizer_model_id: str = field(
        default=WAN_T5_TOKENIZER_ID,
        metadata={
            "help": "UMT5 tokenizer, read with load_text_encoder only: a Hub repo in the HF cache or a local "
            "directory."
        },
    )
    text_encoder_model_id: str = field(
        default=WAN22_DIFFUSERS_MODEL_ID,
        metadata={
            "help": "UMT5 text encoder, from its text_encoder/ folder, read with load_text_encoder only: a "
            "Diffusers repo in the HF cache or a local directory. The Wan2.2 VAE is not read from here: "
            f"always from {WAN22_DIFFUSERS_MODEL_ID}'s vae/ in the HF cache, as LeRobot does."
        },
    )
    base_model_id: str | None = field(
        default=FASTWAM_BASE_MODEL_ID,
        metadata={
            "help": "Weights a fresh policy starts from when its networks are the base's size (a local "
            "directory's own config.json, else LeRobot's full size): a FastWAM pretrained_model/ directory "
            "or a repo in the HF cache; tensors of other shapes stay fresh; null: random weights."
        },
    )
    tokenizer_max_len: int = 128
    load_text_encoder: bool = field(
        default=True,
        metadata={
            "help": "Load UMT5 and its tokenizer to encode task text; false: neither is read and each batch "
            "must carry context/context_mask (the dataset's)."
        },
    )
    mot_checkpoint_mixed_attn: bool = field(
        default=False,
        metadata={"help": "Recompute each layer's joint attention in backward instead of keeping it."},
    )
    torch_dtype: str = field(
        default="bfloat16", metadata={"help": "Dtype of the networks.", "choices": TORCH_DTYPES}
    )
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    num_inference_steps: int = 10
    inference_seed: int | None = 42
    rand_device: str = "cpu"
    text_cfg_scale: float = 1.0
    negative_prompt: str = ""
    sigma_shift: float | None = None
    tiled: bool = False
    fp32_attention: bool = field(
        default=True, metadata={"help": "Attention in fp32 whatever torch_dtype is."}
    )
    compile_action_infer: bool = field(
        default=False,
        metadata={
            "help": "torch.compile the cached action denoising at inference (LeRobot main; not in 0.6.1)."
        },
    )
    precompute_task_contexts: bool = field(
        default=False,
        metadata={
            "help": "Training: encode each dataset task's text once on rank 0 at the start and share the "
            "contexts, so no rank holds UMT5 while it trains (needs load_text_encoder; inference still "
            "encodes the prompt)."
        },
    )
    variant: str = field(
        default="full",
        metadata={
            "help": "full: the Wan2.2 VAE and UMT5 loaded from their sources; tiny: test-size networks and "
            "a tiny VAE and UMT5 built from config (tests, CPU demos; only the tokenizer is read).",
            "choices": VARIANTS,
        },
    )
    use_gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "Activation checkpointing of every MoTLayer (as "
            "--accelerator.activation_checkpointing.mode=full)."
        },
    )
    freeze_video_expert: bool = field(
        default=False,
        metadata={
            "help": "Train the action expert and proprio encoder alone; the ~5 B video expert stays as "
            "loaded."
        },
    )
    toggle_action_dimensions: list[int] = field(
        factory=list,
        converter=lambda v: [int(d) for d in v],
        metadata={
            "help": "Action dimensions turned from [0, 1] into -1/+1 commands after unnormalisation "
            "(LIBERO's gripper); negative ones count from the end."
        },
    )
    video_scheduler: dict[str, Any] = field(factory=_schedule)
    action_scheduler: dict[str, Any] = field(factory=_schedule)
    loss: dict[str, float] = field(factory=lambda: {"lambda_video": 1.0, "lambda_action": 1.0})
    video_dit_config: dict[str, Any] | None = None
    action_dit_config: dict[str, Any] | None = None
    normalization_mapping: dict[str, NormalizationMode] = field(factory=_fastwam_normalization)
    optimizer_lr: float = 1.0e-4
    optimizer_weight_decay: float = 1.0e-2

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for name in (
            "action_dim",
            "action_horizon",
            "n_action_steps",
            "num_video_frames",
            "action_video_freq_ratio",
            "num_inference_steps",
            "tokenizer_max_len",
            "context_len",
        ):
            require_positive_int(name, getattr(self, name))
        if self.proprio_dim is not None:
            require_positive_int("proprio_dim", self.proprio_dim)
        if self.n_obs_steps != 1:
            raise ValueError(
                f"--policy.n_obs_steps must be 1 for fastwam (got {self.n_obs_steps}): the "
                "video window is set by --policy.num_video_frames"
            )
        if self.model_id != WAN22_MODEL_ID and not _is_local_path(self.model_id):
            raise ValueError(
                f"--policy.model_id must be {WAN22_MODEL_ID} or an explicit local path, got {self.model_id!r}"
            )
        if self.torch_dtype not in TORCH_DTYPES:
            raise ValueError(
                f"--policy.torch_dtype: invalid choice {self.torch_dtype!r} (choose from "
                f"{', '.join(TORCH_DTYPES)})"
            )
        if self.variant not in VARIANTS:
            raise ValueError(
                f"--policy.variant: invalid choice {self.variant!r} (choose from {', '.join(VARIANTS)})"
            )
        if self.precompute_task_contexts and not self.load_text_encoder:
            raise ValueError(
                "--policy.precompute_task_contexts=true encodes each task with UMT5 once, at the start: it "
                "needs --policy.load_text_encoder=true (with false, the dataset's context/context_mask are "
                "read instead)"
            )
        self._check_timing()
        self._check_image_size()
        self._check_dicts()
        # LeRobot's derivations: the networks' configs (defaults when unset or empty) with the top-level
        # switches copied in, and the synthetic features of a config that names none.
        if self.variant == "tiny":  # unset networks get the tiny sizes (before LeRobot's defaults would)
            tiny_video, tiny_action = tiny_dit_configs(self.action_dim)
        else:
            tiny_video, tiny_action = {}, {}
        video = (
            copy.deepcopy(self.video_dit_config) or tiny_video or default_video_dit_config(self.action_dim)
        )
        action = (
            copy.deepcopy(self.action_dit_config) or tiny_action or default_action_dit_config(self.action_dim)
        )
        for dit in (video, action):
            dit["fp32_attention"] = bool(self.fp32_attention)
            dit["use_gradient_checkpointing"] = bool(self.use_gradient_checkpointing)
        check_video_dit(video)
        check_action_dit(action, video, self.action_dim)
        self._check_latents(video)
        object.__setattr__(self, "video_dit_config", video)
        object.__setattr__(self, "action_dit_config", action)
        if not self.input_features:
            object.__setattr__(self, "input_features", self._default_inputs())
        if not self.output_features:
            object.__setattr__(
                self, "output_features", {ACTION: PolicyFeature(FeatureType.ACTION, (self.action_dim,))}
            )

    # -- checks on the settings alone --------------------------------------------------------------
    def _check_timing(self) -> None:
        """LeRobot's rules tying the video window, the frame subsampling and the action chunk together."""
        if self.n_action_steps > self.action_horizon:
            raise ValueError(
                f"--policy.n_action_steps ({self.n_action_steps}) cannot exceed "
                f"--policy.action_horizon ({self.action_horizon})"
            )
        span = self.num_video_frames - 1
        if span % self.action_video_freq_ratio:
            raise ValueError(
                f"--policy.num_video_frames - 1 ({span}) must be divisible by "
                f"--policy.action_video_freq_ratio ({self.action_video_freq_ratio})"
            )
        transitions = span // self.action_video_freq_ratio
        if transitions % 4:
            raise ValueError(
                f"the video has {transitions + 1} frames after subsampling; the Wan VAE needs "
                f"4k + 1 (--policy.num_video_frames - 1 = {span} must be a multiple of 4 × "
                f"--policy.action_video_freq_ratio = {4 * self.action_video_freq_ratio})"
            )
        if self.action_horizon % transitions:
            raise ValueError(
                f"--policy.action_horizon ({self.action_horizon}) must be divisible by the "
                f"number of video transitions ({transitions})"
            )

    def _check_image_size(self) -> None:
        def multiple_of_16(side) -> bool:
            return isinstance(side, int) and not isinstance(side, bool) and side >= 16 and side % 16 == 0

        if len(self.image_size) != 2 or not all(multiple_of_16(side) for side in self.image_size):
            raise ValueError(
                f"--policy.image_size must be [height, width], multiples of 16 (the Wan VAE's "
                f"downsampling), got {list(self.image_size)}"
            )

    def _check_latents(self, video: dict[str, Any]) -> None:
        """The video DiT against the Wan2.2 VAE it reads and writes (the same VAE at every ``variant``: 48
        latent channels, 16x smaller images), here rather than when the VAE is built or at the first step.
        """
        for key, role in (("in_dim", "reads"), ("out_dim", "predicts")):
            if video[key] != WAN_VAE_LATENT_CHANNELS:
                raise ValueError(
                    f"--policy.video_dit_config.{key} is {video[key]}, but the video DiT {role} the Wan2.2 "
                    f"VAE's latents, which have {WAN_VAE_LATENT_CHANNELS} channels: set it to "
                    f"{WAN_VAE_LATENT_CHANNELS}"
                )
        frames, height, width = video["patch_size"]
        if frames != 1:
            raise ValueError(
                f"--policy.video_dit_config.patch_size {list(video['patch_size'])} patches {frames} latent "
                "frames together; FastWAM gives every latent frame its own timestep and attention mask, "
                "so the first entry must be 1"
            )
        latent = [side // WAN_VAE_SPATIAL_FACTOR for side in self.image_size]
        if latent[0] % height or latent[1] % width:
            raise ValueError(
                f"--policy.video_dit_config.patch_size {list(video['patch_size'])} does not divide the "
                f"latent image {latent[0]} x {latent[1]} (--policy.image_size {list(self.image_size)} over "
                f"the Wan VAE's {WAN_VAE_SPATIAL_FACTOR}x downsampling): choose a patch height that divides "
                f"{latent[0]} and a width that divides {latent[1]}, or an image size whose sixteenths they "
                "divide"
            )

    def _check_dicts(self) -> None:
        for name in ("video_scheduler", "action_scheduler"):
            value = getattr(self, name)
            if set(value) != {"train_shift", "infer_shift", "num_train_timesteps"}:
                raise ValueError(
                    f"--policy.{name} must have the keys train_shift, infer_shift, "
                    f"num_train_timesteps; got {sorted(value)}"
                )
            if not all(value[key] > 0 for key in ("train_shift", "infer_shift", "num_train_timesteps")):
                raise ValueError(
                    f"--policy.{name}: shifts and num_train_timesteps must be positive, got {value}"
                )
        if set(self.loss) != {"lambda_video", "lambda_action"}:
            raise ValueError(
                f"--policy.loss must have the keys lambda_video and lambda_action, got {sorted(self.loss)}"
            )
        if self.sigma_shift is not None and not self.sigma_shift > 0:
            raise ValueError(f"--policy.sigma_shift must be positive or null, got {self.sigma_shift}")
        # LeRobot's processor counts a negative dimension from the end (its config checks nothing, so a
        # config.json with [-1] is LeRobot's); one outside the action would fail only at the first action
        bad = [d for d in self.toggle_action_dimensions if not -self.action_dim <= d < self.action_dim]
        if bad:
            raise ValueError(
                f"--policy.toggle_action_dimensions {bad} are outside the action's {self.action_dim} "
                f"dimensions (valid: {-self.action_dim} to {self.action_dim - 1}, negative ones count "
                "from the end)"
            )

    def _default_inputs(self) -> dict[str, PolicyFeature]:
        """LeRobot's synthetic inputs: one camera at the full image size, and the state when proprio is on."""
        height, width = self.image_size
        inputs = {f"{CAMERA_PREFIX}image": PolicyFeature(FeatureType.VISUAL, (3, height, width))}
        if self.proprio_dim is not None:
            inputs[OBS_STATE] = PolicyFeature(FeatureType.STATE, (self.proprio_dim,))
        return inputs

    # -- the dataset ---------------------------------------------------------------------------------
    def fit_dataset(self, dataset_features: dict[str, dict]) -> FastWAMConfig:
        """LeRobot's ``make_policy`` for FastWAM: the dataset's action as the output, and the dataset's
        ``observation.images.*`` cameras (sorted) as the inputs, each ``image_size[1] / n`` wide, plus
        ``observation.state`` when ``proprio_dim`` is set. A dataset without a camera (nor a stacked
        ``video``) is refused: the policy would fail at its first batch. The state keeps the dataset's width
        (LeRobot writes ``proprio_dim`` whatever the data, then fails in the proprio encoder), so a mismatch
        is refused by :meth:`validate_features` before any weight is built."""
        if not self.load_text_encoder and not {"context", "context_mask"} <= set(dataset_features):
            # LeRobot fails at the first batch ("Prompt encoding requires loaded text encoder/tokenizer")
            raise ConfigError(
                "--policy.load_text_encoder=false: FastWAM then reads each sample's text context from the "
                "batch, but the dataset has no context/context_mask features; pass "
                "--policy.load_text_encoder=true to encode the task text with UMT5"
            )
        features = dataset_to_policy_features(dataset_features)
        outputs = {k: f for k, f in features.items() if f.type is FeatureType.ACTION} or dict(
            self.output_features
        )
        cameras = sorted(
            k
            for k, ft in dataset_features.items()
            if k.startswith(CAMERA_PREFIX) and ft.get("dtype") in ("video", "image")
        )
        if not cameras and VIDEO_KEY in dataset_features:  # LeRobot's pre-stacked video, read as it is
            return attrs.evolve(self, output_features=outputs)
        if not cameras:
            # LeRobot keeps its synthetic camera here and fails at the first batch (a KeyError)
            observed = sorted(k for k in dataset_features if k.startswith("observation."))
            raise ConfigError(
                f"fastwam needs a camera, but the dataset has no {CAMERA_PREFIX}* feature (its observations: "
                f"{', '.join(observed) or 'none'}): FastWAM learns from and predicts the camera video; use a "
                "dataset with a camera"
            )
        height, width = self.image_size
        inputs = {k: PolicyFeature(FeatureType.VISUAL, (3, height, width // len(cameras))) for k in cameras}
        if self.proprio_dim is not None and OBS_STATE in features:
            inputs[OBS_STATE] = features[OBS_STATE]
        return attrs.evolve(self, input_features=inputs, output_features=outputs)

    def _refuse_other_width(self, what: str, shape: list[int], saved: str) -> None:
        """A pretrained policy (``--policy.path``) on a dataset of other widths: its DiTs and weights are
        built for its own ``action_dim``/``proprio_dim``, so the flag the fresh-policy message suggests
        would fail on the saved ``action_dit_config``; say what can work instead."""
        if not self.pretrained_path:
            return
        raise ValueError(
            f"the dataset's {what} has shape {shape}, but the pretrained policy {self.pretrained_path} was "
            f"trained with {saved}, and a pretrained policy's widths cannot change (its networks and "
            f"weights are built for them): use a dataset with those widths, or train a fresh policy of its "
            f"network sizes that starts from its weights, --policy.type=fastwam --policy.base_model_id="
            f"{self.pretrained_path} (tensors of other widths keep their fresh initialisation)"
        )

    def validate_features(self) -> None:
        """LeRobot's feature rules, checked once the features come from the dataset."""
        if not self.image_features:
            raise ValueError(
                f"fastwam needs a camera (observation.images.*), but the inputs have none: "
                f"{sorted(self.input_features) or 'none'}"
            )
        action = self.action_feature
        if action is None:
            raise ValueError(
                f"fastwam needs an 'action' output feature; got {sorted(self.output_features) or 'none'}"
            )
        if tuple(action.shape) != (self.action_dim,):
            self._refuse_other_width("action", list(action.shape), f"action_dim={self.action_dim}")
            raise ValueError(
                f"the action has shape {list(action.shape)} but --policy.action_dim is "
                f"{self.action_dim}; pass --policy.action_dim={action.shape[-1]}"
            )
        if self.proprio_dim is not None:
            state = self.robot_state_feature
            if state is None:
                raise ValueError(
                    f"--policy.proprio_dim={self.proprio_dim} needs observation.state, which "
                    "the inputs lack; pass --policy.proprio_dim=null to train without "
                    "proprioception"
                )
            if tuple(state.shape) != (self.proprio_dim,):
                self._refuse_other_width(
                    "observation.state", list(state.shape), f"proprio_dim={self.proprio_dim}"
                )
                raise ValueError(
                    f"observation.state has shape {list(state.shape)} but --policy.proprio_dim "
                    f"is {self.proprio_dim}; pass --policy.proprio_dim={state.shape[-1]}"
                )
        height, width = self.image_size
        total = 0
        for name, feature in self.image_features.items():
            shape = tuple(feature.shape)
            if len(shape) != 3 or shape[0] != 3:
                raise ValueError(f"fastwam camera {name} must be (3, H, W), got {list(shape)}")
            if shape[1] != height:
                raise ValueError(
                    f"fastwam camera {name} is {shape[1]} pixels high; --policy.image_size needs {height}"
                )
            total += shape[2]
        if total != width:
            raise ValueError(
                f"fastwam's cameras are {total} pixels wide side by side, but "
                f"--policy.image_size needs {width} (each of the {len(self.image_features)} "
                "cameras gets width // cameras; choose a width the camera count divides)"
            )

    # -- what the runner reads -----------------------------------------------------------------------
    @property
    def model_video_frames(self) -> int:
        """Frames the model sees: the raw window subsampled by ``action_video_freq_ratio`` (33 → 9)."""
        return (self.num_video_frames - 1) // self.action_video_freq_ratio + 1

    @property
    def observation_delta_indices(self) -> list[int]:
        """Every observation at the video frames, ``action_video_freq_ratio`` actions apart (0, 4, …)."""
        return list(range(0, self.num_video_frames, self.action_video_freq_ratio))

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.action_horizon))

    def activation_checkpointing(self) -> str | None:
        return "--policy.use_gradient_checkpointing" if self.use_gradient_checkpointing else None

    def optimizer_preset(self) -> OptimizerConfig:
        # LeRobot's AdamWConfig(lr, weight_decay), its other defaults: betas 0.9/0.999, eps 1e-8, clip 10.
        return OptimizerConfig(
            type="adamw",
            lr=self.optimizer_lr,
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=self.optimizer_weight_decay,
            grad_clip_norm=10.0,
        )

    def full_size_networks(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """LeRobot's default DiT configs at this ``action_dim``: the size of ``lerobot/fastwam_base``."""
        return default_video_dit_config(self.action_dim), default_action_dit_config(self.action_dim)

    def fits_base_model(self) -> bool:
        """Whether the base's weights fit these network sizes (``base.py``: LeRobot's full size for a Hub id,
        a local directory's own ``config.json``)."""
        from lerobot_cli.policies.fastwam.base import size_difference

        return size_difference(self) is None

    # -- what the run reads from outside its dataset and checkpoints ---------------------------------------
    def tokenizer(self) -> Source | None:
        """The UMT5 tokenizer, under the custom-code refusal; not read without the text encoder."""
        if not self.load_text_encoder:
            return None
        return Source("--policy.tokenizer_model_id", self.tokenizer_model_id)

    def external_sources(self) -> tuple[Source, ...]:
        """The frozen VAE, UMT5 and tokenizer this config reads and the base it starts from (``sources.py``,
        ``base.py``), each found offline before any work."""
        from lerobot_cli.policies.fastwam.sources import external_sources

        return external_sources(self)

    def prepare_training(self, policy: Any, run: Any) -> list[str]:
        """``precompute_task_contexts``: each task's context encoded once on rank 0 and shared, so no rank
        holds UMT5 while training (``precompute.py``)."""
        from lerobot_cli.policies.fastwam.precompute import prepare_task_contexts

        return prepare_task_contexts(self, policy, run)

    def dry_run_notes(self) -> list[str]:
        """The frozen VAE's and UMT5's bytes on every rank, counted on the meta device, and what
        ``precompute_task_contexts`` saves (``precompute.py``)."""
        from lerobot_cli.policies.fastwam.precompute import frozen_parts_note

        return [frozen_parts_note(self)]

    def initial_weights(self) -> InitialWeights | None:
        """The base model's weights over a fresh policy, or why none (``base.py``)."""
        from lerobot_cli.policies.fastwam.base import initial_weights

        return initial_weights(self)
