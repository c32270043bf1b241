"""``FastWAMModel``: FastWAM's trainable networks and the core passes the policy runs them through.

LeRobot's ``FastWAM`` core without its frozen encoders: the mixture of transformers (``mot.py``: the video
and action experts, ``video_dit.py`` and ``action_dit.py``, layer by layer) and the proprio encoder. Its
passes are the joint MoT prediction of video and action velocities (training) and, for action inference,
the first-frame prefill and the cached action prediction; ``modeling.py``'s ``FastWAMPolicy`` holds it as
``model`` and does the rest (frozen encoders, batches, losses, sampling).

The networks carry LeRobot 0.6.1's state-dict names, shapes and dtypes (``model.mot.mixtures.*``,
``model.mot.layers.<i>.blocks.{video,action}.*``, ``model.proprio_encoder.*``, under the policy's ``model``).

Dtype: every parameter is ``torch_dtype`` (bf16 by default), the proprio encoder included, as LeRobot builds
it; inside, the video expert's time embedding, time projection and head compute in fp32, attention in fp32
with ``fp32_attention`` (see ``video_dit`` and ``blocks``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from lerobot_cli.policies.fastwam.action_dit import ActionDiT
from lerobot_cli.policies.fastwam.attention import mot_attention_mask
from lerobot_cli.policies.fastwam.config import FastWAMConfig
from lerobot_cli.policies.fastwam.dtypes import TORCH_DTYPES
from lerobot_cli.policies.fastwam.mot import MoT
from lerobot_cli.policies.fastwam.video_dit import VideoDiT


class VideoCache(NamedTuple):
    """The first frame's per-layer keys/values and the joint mask the cached action passes read."""

    kv: list[tuple[Tensor, Tensor]]
    mask: Tensor


class FastWAMModel(nn.Module):
    """LeRobot's ``FastWAM`` core without its frozen encoders: ``mot`` (both experts and the 30 layers) and
    the ``proprio_encoder``. ``video_expert``, ``action_expert`` and ``dit`` are unregistered aliases of
    ``mot.mixtures["video"]``, ``mot.mixtures["action"]`` and ``mot``: registering them too would give every
    tensor several state-dict names."""

    def __init__(self, config: FastWAMConfig) -> None:
        super().__init__()
        video = VideoDiT(config.video_dit_config)
        action = ActionDiT(config.action_dit_config)
        self.mot = MoT(video, action, checkpoint_attention=config.mot_checkpoint_mixed_attn)
        object.__setattr__(self, "video_expert", video)
        object.__setattr__(self, "action_expert", action)
        object.__setattr__(self, "dit", self.mot)
        self.text_dim = int(config.video_dit_config["text_dim"])
        self.proprio_dim = config.proprio_dim
        self.proprio_encoder = (
            None if config.proprio_dim is None else nn.Linear(config.proprio_dim, self.text_dim)
        )
        self.to(TORCH_DTYPES[config.torch_dtype])

    def append_proprio(
        self, context: Tensor, context_mask: Tensor, proprio: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The encoded state ``(B, proprio_dim)`` as one more context token (always attended); unchanged when
        the policy has no proprioception or no state is given."""
        if self.proprio_encoder is None or proprio is None:
            return context, context_mask
        if proprio.ndim != 2 or proprio.shape[1] != self.proprio_dim:
            raise ValueError(f"proprio must be (B, {self.proprio_dim}), got {tuple(proprio.shape)}")
        token = self.proprio_encoder(proprio.to(device=context.device, dtype=context.dtype).unsqueeze(1))
        ones = torch.ones((context_mask.shape[0], 1), dtype=torch.bool, device=context_mask.device)
        return torch.cat([context, token.to(context.dtype)], dim=1), torch.cat([context_mask, ones], dim=1)

    def mixture_mask(
        self, video_len: int, action_len: int, tokens_per_frame: int, device: torch.device
    ) -> Tensor:
        video = self.video_expert.self_attention_mask(video_len, tokens_per_frame, device)
        return mot_attention_mask(video, action_len, tokens_per_frame)

    def predict(
        self,
        latents: Tensor,
        timestep_video: Tensor,
        actions: Tensor,
        timestep_action: Tensor,
        context: Tensor,
        context_mask: Tensor,
        video_actions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Joint pass: the video velocity ``(B, C, T, H, W)`` (fp32) and the action velocity
        ``(B, horizon, A)`` from noisy latents (first frame clean), noisy actions, their timesteps and the
        text context. ``video_actions``: the actions an action-conditioned video DiT reads (LeRobot passes
        the clean ones)."""
        video = self.video_expert.embed(latents, timestep_video, context, context_mask, video_actions)
        action = self.action_expert.embed(actions, timestep_action, context, context_mask)
        mask = self.mixture_mask(
            video.stream.tokens.shape[1],
            action.stream.tokens.shape[1],
            video.tokens_per_frame,
            video.stream.tokens.device,
        )
        out = self.mot({"video": video.stream, "action": action.stream}, mask)
        pred_video = self.video_expert.unembed(out["video"], video)
        return pred_video, self.action_expert.unembed(out["action"], action)

    def prefill(
        self, first_frame_latents: Tensor, context: Tensor, context_mask: Tensor, action_len: int
    ) -> VideoCache:
        """The clean first latent frame ``(B, C, 1, H, W)`` through the video expert at timestep 0, once per
        observation; needs ``first_frame_causal`` video masks (then the cache is exact)."""
        if self.video_expert.attention_mask_mode != "first_frame_causal":
            raise ValueError("cached action inference needs video_attention_mask_mode='first_frame_causal'")
        timestep = torch.zeros(
            (first_frame_latents.shape[0],),
            dtype=first_frame_latents.dtype,
            device=first_frame_latents.device,
        )
        video = self.video_expert.embed(first_frame_latents, timestep, context, context_mask)
        video_len = video.stream.tokens.shape[1]
        mask = self.mixture_mask(video_len, action_len, video.tokens_per_frame, video.stream.tokens.device)
        return VideoCache(self.mot.prefill_video(video.stream, mask[:video_len, :video_len]), mask)

    def predict_action(
        self,
        cache: VideoCache,
        actions: Tensor,
        timestep_action: Tensor,
        context: Tensor,
        context_mask: Tensor,
    ) -> Tensor:
        """The action velocity from the video cache (one denoising step of action inference)."""
        action = self.action_expert.embed(actions, timestep_action, context, context_mask)
        tokens = self.mot.action_with_cache(action.stream, cache.kv, cache.mask)
        return self.action_expert.unembed(tokens, action)
