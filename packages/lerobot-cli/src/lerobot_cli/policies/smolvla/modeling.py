"""``SmolVLAPolicy``: the trainable SmolVLA module behind ``--policy.type=smolvla`` (LeRobot 0.6.1's).

It works on batches the pre-processor already normalised and tokenised (``observation.language.tokens`` and
``observation.language.attention_mask``). Cameras arrive in [0, 1]; each is resized keeping its aspect and
padded on the left and top to ``resize_imgs_with_padding`` (width, height), then scaled to [-1, 1] (the
padding becomes -1), as LeRobot's ``prepare_images`` does. Cameras the config lists but the batch lacks
become, up to ``empty_cameras`` of them, all -1 images masked out of attention.

``SmolVLAFlowModel`` is LeRobot's ``VLAFlowMatching`` (``model.`` in the state dict): the prefix (each
camera's SigLIP tokens × √width, the task tokens × √width, one state token) attends bidirectionally to
itself; the suffix (``chunk_size`` action tokens fused with the flow time) attends to the prefix and
causally to itself. ``forward`` returns the flow-matching loss averaged over the real action dimensions
and the steps inside the episode (``action_is_pad``); ``predict_action_chunk`` integrates the flow in
``num_steps`` Euler steps over a cached prefix.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.features import FeatureType
from lerobot_cli.policies.common.chunked_policy import ACTION, OBS_STATE, ChunkedFlowPolicy
from lerobot_cli.policies.common.flow_matching import (
    euler_integrate,
    sample_beta_time,
    sample_flow_noise,
    sinusoidal_time_embedding,
)
from lerobot_cli.policies.common.masks import attention_mask_2d
from lerobot_cli.policies.common.tensors import pad_last_dim
from lerobot_cli.policies.smolvla.config import SmolVLAConfig
from lerobot_cli.policies.smolvla.expert import SmolVLMWithExpertModel
from lerobot_cli.policies.smolvla.vlm import load_vlm_config

ACTION_IS_PAD = "action_is_pad"


def pad_sequence(x: Tensor, length: int, value: float = 0) -> Tensor:
    """``(B, L, …)`` padded along L to ``length`` (LeRobot's ``pad_tensor``)."""
    out = torch.full((x.shape[0], length, *x.shape[2:]), value, dtype=x.dtype, device=x.device)
    out[:, : x.shape[1]] = x
    return out


def resize_with_pad_left_top(image: Tensor, height: int, width: int, pad_value: float = 0.0) -> Tensor:
    """``(B, C, H, W)`` resized keeping the aspect ratio (bilinear, no clamp), padded on the left and top
    (LeRobot's SmolVLA/xVLA ``resize_with_pad``; pi0's pads centred)."""
    if image.ndim != 4:
        raise ValueError(f"(b,c,h,w) expected, but got {tuple(image.shape)}")
    cur_h, cur_w = image.shape[2:]
    if cur_h == height and cur_w == width:
        return image
    ratio = max(cur_w / width, cur_h / height)
    new_h, new_w = int(cur_h / ratio), int(cur_w / ratio)
    resized = F.interpolate(image, size=(new_h, new_w), mode="bilinear", align_corners=False)
    return F.pad(resized, (max(0, width - new_w), 0, max(0, height - new_h), 0), value=pad_value)


class SmolVLAFlowModel(nn.Module):
    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__()
        self.config = config
        self.vlm_with_expert = SmolVLMWithExpertModel(
            load_vlm_config(config.vlm_model_name),
            attention_mode=config.attention_mode,
            num_expert_layers=config.num_expert_layers,
            num_vlm_layers=config.num_vlm_layers,
            self_attn_every_n_layers=config.self_attn_every_n_layers,
            expert_width_multiplier=config.expert_width_multiplier,
            load_vlm_weights=config.load_vlm_weights,
        )
        width = self.vlm_with_expert.config.text_config.hidden_size
        expert = self.vlm_with_expert.expert_hidden_size
        self.state_proj = nn.Linear(config.max_state_dim, width)
        self.action_in_proj = nn.Linear(config.max_action_dim, expert)
        self.action_out_proj = nn.Linear(expert, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(expert * 2, expert)
        self.action_time_mlp_out = nn.Linear(expert, expert)

    def sample_noise(self, shape, device: torch.device) -> Tensor:
        return sample_flow_noise(shape, device)

    def sample_time(self, batch_size: int, device: torch.device) -> Tensor:
        """``Beta(1.5, 1) * 0.999 + 0.001`` drawn on the CPU (LeRobot's constants for SmolVLA)."""
        return sample_beta_time(batch_size, device, alpha=1.5, beta=1.0, scale=0.999, offset=0.001)

    def embed_prefix(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_masks: Tensor,
        state: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        towers = self.vlm_with_expert
        embs, pad_masks, att_masks = [], [], []
        for image, image_mask in zip(images, image_masks, strict=True):
            emb = towers.embed_image(image)
            emb = emb * torch.tensor(emb.shape[-1] ** 0.5, dtype=emb.dtype, device=emb.device)
            batch_size, count = emb.shape[:2]
            embs.append(emb)
            pad_masks.append(image_mask[:, None].expand(batch_size, count))
            att_masks += [0] * count
        lang = towers.embed_language_tokens(tokens)
        lang = lang * math.sqrt(lang.shape[-1])
        embs.append(lang)
        pad_masks.append(token_masks)
        att_masks += [0] * lang.shape[1]
        state_emb = self.state_proj(state)
        state_emb = state_emb[:, None, :] if state_emb.ndim == 2 else state_emb
        embs.append(state_emb)
        batch_size = state_emb.shape[0]
        pad_masks.append(
            torch.ones(batch_size, state_emb.shape[1], dtype=torch.bool, device=state_emb.device)
        )
        att_masks += [1] * state_emb.shape[1]  # the prefix does not see the state
        embs = torch.cat(embs, dim=1)
        pad_masks = torch.cat(pad_masks, dim=1)
        att_masks = torch.tensor(att_masks, dtype=torch.bool, device=pad_masks.device)[None, :]
        if pad_masks.shape[1] < self.config.prefix_length:
            length = self.config.prefix_length
            embs, pad_masks = pad_sequence(embs, length), pad_sequence(pad_masks, length)
            att_masks = pad_sequence(att_masks, length)
        return embs, pad_masks, att_masks.expand(batch_size, -1)

    def embed_suffix(self, noisy_actions: Tensor, time: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        action_emb = self.action_in_proj(noisy_actions)
        batch_size, dtype = action_emb.shape[0], action_emb.dtype
        width = self.vlm_with_expert.expert_hidden_size
        time_emb = sinusoidal_time_embedding(time, width, self.config.min_period, self.config.max_period)
        time_emb = time_emb.type(dtype=dtype)[:, None, :].expand_as(action_emb)
        emb = self.action_time_mlp_in(torch.cat([action_emb, time_emb], dim=2))
        emb = self.action_time_mlp_out(F.silu(emb))
        pad_masks = torch.ones(batch_size, emb.shape[1], dtype=torch.bool, device=emb.device)
        # LeRobot's suffix block marks are floats (the embeddings' dtype); only their cumulative order matters
        att_masks = torch.ones(self.config.chunk_size, dtype=emb.dtype, device=emb.device)
        return emb, pad_masks, att_masks[None, :].expand(batch_size, -1)

    def forward(self, images, image_masks, tokens, token_masks, state, actions, noise, time) -> Tensor:
        """Per-element flow-matching losses ``(B, chunk_size, max_action_dim)``."""
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        u_t = noise - actions
        prefix, prefix_pad, prefix_att = self.embed_prefix(images, image_masks, tokens, token_masks, state)
        suffix, suffix_pad, suffix_att = self.embed_suffix(x_t, time)
        pad_masks = torch.cat([prefix_pad, suffix_pad], dim=1)
        att_masks = torch.cat([prefix_att, suffix_att], dim=1)
        mask = attention_mask_2d(pad_masks, att_masks)
        position_ids = torch.cumsum(pad_masks, dim=1) - 1
        (_, suffix_out), _ = self.vlm_with_expert.run([prefix, suffix], mask, position_ids)
        v_t = self.action_out_proj(suffix_out[:, -self.config.chunk_size :].to(dtype=torch.float32))
        return F.mse_loss(u_t, v_t, reduction="none")

    def sample_actions(self, images, image_masks, tokens, token_masks, state, noise: Tensor | None = None):
        batch_size, device = state.shape[0], state.device
        if noise is None:
            noise = self.sample_noise(
                (batch_size, self.config.chunk_size, self.config.max_action_dim), device
            )
        prefix, prefix_pad, prefix_att = self.embed_prefix(images, image_masks, tokens, token_masks, state)
        mask = attention_mask_2d(prefix_pad, prefix_att)
        position_ids = torch.cumsum(prefix_pad, dim=1) - 1
        _, cache = self.vlm_with_expert.run([prefix, None], mask, position_ids, fill_cache=True)
        return euler_integrate(
            noise, self.config.num_steps, lambda x_t, time: self.denoise_step(prefix_pad, cache, x_t, time)
        )

    def denoise_step(self, prefix_pad: Tensor, cache, x_t: Tensor, time: Tensor) -> Tensor:
        suffix, suffix_pad, suffix_att = self.embed_suffix(x_t, time)
        batch_size, suffix_len, prefix_len = prefix_pad.shape[0], suffix_pad.shape[1], prefix_pad.shape[1]
        prefix_2d = prefix_pad[:, None, :].expand(batch_size, suffix_len, prefix_len)
        mask = torch.cat([prefix_2d, attention_mask_2d(suffix_pad, suffix_att)], dim=2)
        position_ids = torch.sum(prefix_pad, dim=-1)[:, None] + torch.cumsum(suffix_pad, dim=1) - 1
        (_, suffix_out), _ = self.vlm_with_expert.run([None, suffix], mask, position_ids, cache=cache)
        return self.action_out_proj(suffix_out[:, -self.config.chunk_size :].to(dtype=torch.float32))


class SmolVLAPolicy(ChunkedFlowPolicy):
    name: ClassVar[str] = "smolvla"
    config_class: ClassVar[type[SmolVLAConfig]] = SmolVLAConfig
    # lerobot-parallel's own reading of a bare model (build_plan without defaults); the spec is the source.
    _fsdp_wrap_modules: ClassVar[list[str]] = list(SmolVLAConfig.spec.wrap_units)
    _fsdp_unit_groups: ClassVar[list[tuple[str, ...]]] = list(SmolVLAConfig.spec.unit_groups)
    _fsdp_no_forward_modules: ClassVar[tuple[str, ...]] = SmolVLAConfig.spec.no_forward_modules

    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__()
        config.validate_features()
        self.config = config
        self.model = SmolVLAFlowModel(config)
        self._apply_freezing()
        self.reset()

    def _apply_freezing(self) -> None:
        """LeRobot's ``set_requires_grad``: the vision tower, the whole VLM, or (training the VLM) the parts
        nothing reads; ``state_proj`` follows ``train_state_proj``."""
        towers = self.model.vlm_with_expert
        frozen: list[nn.Module] = []
        if self.config.freeze_vision_encoder:
            frozen.append(towers.vlm.model.vision_model)
        if self.config.train_expert_only:
            frozen.append(towers.vlm)
        else:
            frozen += towers.unread_modules()
        for module in frozen:
            module.requires_grad_(False)
        self.model.state_proj.requires_grad_(self.config.train_state_proj)
        self.train(self.training)

    def train(self, mode: bool = True) -> SmolVLAPolicy:
        super().train(mode)
        towers = self.model.vlm_with_expert
        if self.config.freeze_vision_encoder:
            towers.vlm.model.vision_model.eval()
        if self.config.train_expert_only:
            towers.vlm.eval()
        return self

    # -- inputs -----------------------------------------------------------------------------------
    def _images(self, batch: dict[str, Any]) -> tuple[list[Tensor], list[Tensor]]:
        """LeRobot's ``prepare_images``: the config's cameras (its VISUAL features, empty cameras last) that
        the batch has, resized with left/top padding and scaled to [-1, 1]; then, for at most
        ``empty_cameras`` of those it lacks, an all -1 image masked out."""
        expected = [k for k, f in self.config.with_empty_cameras().items() if f.type == FeatureType.VISUAL]
        present = [k for k in expected if k in batch]
        if not present:
            raise KeyError(f"smolvla batch has none of its cameras {expected}; it has {sorted(batch)}")
        images, masks = [], []
        for key in present:
            image = batch[key][:, -1] if batch[key].ndim == 5 else batch[key]
            width, height = self.config.resize_imgs_with_padding
            image = resize_with_pad_left_top(image, height, width, pad_value=0)
            image = image * 2.0 - 1.0
            if f"{key}_padding_mask" in batch:
                mask = batch[f"{key}_padding_mask"].bool()
            else:
                mask = torch.ones(image.shape[0], dtype=torch.bool, device=image.device)
            images.append(image)
            masks.append(mask)
        for _ in range(min(len(expected) - len(present), self.config.empty_cameras)):
            images.append(torch.ones_like(images[-1]) * -1)
            masks.append(torch.zeros_like(masks[-1]))
        return images, masks

    def _state(self, batch: dict[str, Any]) -> Tensor:
        state = batch[OBS_STATE]
        state = state[:, -1, :] if state.ndim > 2 else state
        return pad_last_dim(state, self.config.max_state_dim)

    # -- training -------------------------------------------------------------------
    def forward(
        self, batch: dict[str, Any], noise: Tensor | None = None, time: Tensor | None = None
    ) -> tuple[Tensor, dict[str, float]]:
        """Flow-matching loss: the mean over the real action dimensions of the steps inside the episode
        (LeRobot's: padded steps count zero and are left out of the denominator)."""
        images, image_masks = self._images(batch)
        tokens, token_masks = self._language(batch)
        state = self._state(batch)
        actions = pad_last_dim(batch[ACTION], self.config.max_action_dim)
        if noise is None or time is None:
            drawn_noise, drawn_time = self._draw_noise_and_time(batch, actions)
            noise = drawn_noise if noise is None else noise
            time = drawn_time if time is None else time
        losses = self.model(images, image_masks, tokens, token_masks, state, actions, noise, time)
        losses = losses[:, :, : self._action_dim()]
        is_pad = batch.get(ACTION_IS_PAD)
        if is_pad is None:
            return losses.mean(), {}
        losses = losses * (~is_pad).unsqueeze(-1)
        valid = ((~is_pad).sum() * losses.shape[-1]).clamp_min(1)
        return losses.sum() / valid, {}
