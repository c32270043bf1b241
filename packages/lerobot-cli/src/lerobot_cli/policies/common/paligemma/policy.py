"""``PiFlowPolicy``: what the trainable pi0 and pi05 modules share (``--policy.type=pi0`` / ``pi05``).

``PI0Policy`` (``policies/pi0/modeling.py``) and ``PI05Policy`` (``policies/pi05/modeling.py``) subclass it
with their name, config class, flow model and the older module names their files may carry.

It works on batches the pre-processor already normalised and tokenised (``observation.language.tokens``
and ``observation.language.attention_mask``, as LeRobot's pipeline writes them). Images arrive in
[0, 1]; they are resized with padding to ``image_resolution`` and scaled to SigLIP's [-1, 1] here, and
cameras the config expects but the batch lacks become all -1 images masked out of attention (LeRobot's
``empty_cameras``). ``forward`` returns the flow-matching loss; ``predict_action_chunk`` and
``select_action`` return normalised actions for the post-processor.

Sharding: SigLIP encoder layers are FSDP units, the token embedding is one, and PaliGemma layer i with
expert layer i form one grouped unit whose forward is ``PaliGemmaLayer.joint`` (see :mod:`.gemma`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.features import FeatureType
from lerobot_cli.policies.common.chunked_policy import ACTION, OBS_STATE, ChunkedFlowPolicy
from lerobot_cli.policies.common.paligemma.config import PiFlowConfig
from lerobot_cli.policies.common.paligemma.flow import PI0FlowModel
from lerobot_cli.policies.common.tensors import pad_last_dim

# dtype=bfloat16 casts the towers (``paligemma_with_expert``) alone, and inside them keeps these parts fp32:
# LeRobot's ``PaliGemmaWithExpertModel.to_bfloat16_for_selected_params`` (names relative to the towers).
# The flow model's own projections (action_in/out_proj, state_proj, the time MLPs) stay fp32, as there.
FLOAT32_PARTS = (
    "vision_tower",
    "multi_modal_projector",
    "input_layernorm",
    "post_attention_layernorm",
    "model.norm",
)


def cast_towers_like_lerobot(towers: nn.Module) -> None:
    """bf16 towers with LeRobot's fp32 parts: the same parameters bf16 as LeRobot's bf16 pi0/pi05, so the
    same weights give the same forward and every key is saved in LeRobot's dtype."""
    towers.to(torch.bfloat16)
    for name, param in towers.named_parameters():
        if any(part in name for part in FLOAT32_PARTS):
            param.data = param.data.to(torch.float32)


def resize_with_pad(images: Tensor, height: int, width: int) -> Tensor:
    """openpi's resize keeping the aspect ratio, then centred zero padding; ``(B, C, H, W)`` in [0, 1]."""
    cur_h, cur_w = images.shape[-2:]
    ratio = max(cur_w / width, cur_h / height)
    new_h, new_w = int(cur_h / ratio), int(cur_w / ratio)
    resized = F.interpolate(images, size=(new_h, new_w), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    top, extra_h = divmod(height - new_h, 2)
    left, extra_w = divmod(width - new_w, 2)
    return F.pad(resized, (left, left + extra_w, top, top + extra_h), value=0.0)


class PiFlowPolicy(ChunkedFlowPolicy):
    """The base of pi0's and pi05's policies; a subclass sets the class variables below."""

    name: ClassVar[str]
    config_class: ClassVar[type[PiFlowConfig]]
    flow_class: ClassVar[type[PI0FlowModel]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """lerobot-parallel's own reading of a bare model (build_plan without defaults): the FSDP units of
        the subclass's config spec, which stays the source."""
        super().__init_subclass__(**kwargs)
        spec = cls.config_class.spec
        cls._fsdp_wrap_modules = list(spec.wrap_units)
        cls._fsdp_unit_groups = list(spec.unit_groups)
        cls._fsdp_no_forward_modules = spec.no_forward_modules

    def __init__(self, config: PiFlowConfig) -> None:
        super().__init__()
        config.validate_features()
        self.config = config
        self.model = self.flow_class(config)
        self._apply_dtype_and_freezing()
        self.reset()

    def _apply_dtype_and_freezing(self) -> None:
        towers = self.model.paligemma_with_expert
        if self.config.dtype == "bfloat16":
            cast_towers_like_lerobot(towers)
        frozen = []
        if self.config.freeze_vision_encoder:
            frozen.append(towers.paligemma.model.vision_tower)
        if self.config.train_expert_only:
            frozen.append(towers.paligemma)
        # Parameters in LeRobot's files that nothing reads are frozen too: they take no gradient, optimizer
        # state or DDP bucket (LeRobot's AdamW skips them for having no gradient, the same update).
        for module in [*frozen, *towers.unread_modules()]:
            module.requires_grad_(False)

    def train(self, mode: bool = True) -> PiFlowPolicy:
        super().train(mode)
        towers = self.model.paligemma_with_expert
        if self.config.freeze_vision_encoder:
            towers.paligemma.model.vision_tower.eval()
        if self.config.train_expert_only:
            towers.paligemma.eval()
        return self

    # Older names of this policy's own modules in checkpoints LeRobot also loads (openpi's converted files).
    _renamed_modules: ClassVar[dict[str, str]] = {}
    _dropped_modules: ClassVar[tuple[str, ...]] = ()  # the other variant's modules this one lacks

    def adapt_state_dict(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A pi0 file in another layout LeRobot accepts, in this module's names (what LeRobot's
        ``from_pretrained`` fixes too): keys without the ``model.`` prefix, openpi's older time-MLP
        names, a file without the token embedding (openpi ties it to PaliGemma's ``lm_head``), and a
        SigLIP tower saved without its ``vision_model.`` level (transformers ≥ 5.6). A file already
        in our layout passes unchanged."""
        own = set(self.state_dict())
        if own >= set(state):
            return state
        tower = "paligemma_with_expert.paligemma.model.vision_tower."
        adapted: dict[str, Tensor] = {}
        for key, value in state.items():
            key = key.removeprefix("model.")
            for old, new in self._renamed_modules.items():
                if key.startswith(old):
                    key = new + key[len(old) :]
            if key.startswith(tower) and not key.startswith(tower + "vision_model."):
                key = tower + "vision_model." + key[len(tower) :]
            adapted[f"model.{key}"] = value
        embed = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
        head = "model.paligemma_with_expert.paligemma.lm_head.weight"
        if embed not in adapted and head in adapted:
            adapted[embed] = adapted[head].clone()
        return {
            k: v for k, v in adapted.items() if not k.removeprefix("model.").startswith(self._dropped_modules)
        }

    # -- inputs -----------------------------------------------------------------------------------
    def _images(self, batch: dict[str, Any]) -> tuple[list[Tensor], list[Tensor]]:
        """SigLIP inputs in [-1, 1] per expected camera, and which rows really have that camera.

        The cameras are the VISUAL input features in the config's order, whatever their names (LeRobot's
        ``config.image_features``; ``observation.wrist_rgb`` is as much a camera as
        ``observation.images.top``): those in the batch first, then one all -1 image, masked out, per camera
        the batch lacks (the ``empty_cameras`` placeholders among them), as LeRobot's ``_preprocess_images``
        orders them."""
        expected = [k for k, f in self.config.with_empty_cameras().items() if f.type == FeatureType.VISUAL]
        cameras = [k for k in expected if k in batch]
        if not cameras:
            raise KeyError(f"{self.name} batch has none of its cameras {expected}; it has {sorted(batch)}")
        size = tuple(self.config.image_resolution)
        images, masks = [], []
        for key in cameras:
            image = batch[key].to(torch.float32)
            if tuple(image.shape[-2:]) != size:
                image = resize_with_pad(image, *size)
            images.append(image * 2.0 - 1.0)
            masks.append(torch.ones(image.shape[0], dtype=torch.bool, device=image.device))
        for _ in range(len(expected) - len(cameras)):
            images.append(torch.full_like(images[0], -1.0))
            masks.append(torch.zeros_like(masks[0]))
        return images, masks

    def _state(self, batch: dict[str, Any]) -> Tensor | None:
        return pad_last_dim(batch[OBS_STATE], self.config.max_state_dim)

    # -- training -------------------------------------------------------------------
    def forward(
        self,
        batch: dict[str, Any],
        noise: Tensor | None = None,
        time: Tensor | None = None,
        reduction: str = "mean",
    ) -> tuple[Tensor, dict[str, float]]:
        """Mean flow-matching loss over the real action dimensions (LeRobot averages padded steps too);
        ``reduction="none"``: each sample's mean over its steps and action dimensions, ``(B,)``, as LeRobot's
        ``forward(batch, reduction="none")`` (what ``--sample_weighting.*`` weights)."""
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
        images, image_masks = self._images(batch)
        tokens, token_masks = self._language(batch)
        actions = pad_last_dim(batch[ACTION], self.config.max_action_dim)
        if noise is None or time is None:
            drawn_noise, drawn_time = self._draw_noise_and_time(batch, actions)
            noise = drawn_noise if noise is None else noise
            time = drawn_time if time is None else time
        losses = self.model(
            images, image_masks, tokens, token_masks, self._state(batch), actions, noise, time
        )
        losses = losses[:, :, : self._action_dim()]
        if reduction == "none":
            return losses.mean(dim=(1, 2)), {}
        return losses.mean(), {}


def adapt_state_dict(policy: PiFlowPolicy, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """pi0's and pi05's ``PolicySpec.state_dict_adapter``: ``policy.adapt_state_dict`` (per variant)."""
    return policy.adapt_state_dict(state)
