"""pi0's flow-matching model: prefix (images + language) and suffix (state + noisy actions + time) tokens.

Training (openpi's PI0Pytorch): ``x_t = t·noise + (1-t)·actions``, the expert predicts the velocity
``u_t = noise - actions`` and the loss is the element-wise squared error. Inference integrates the
velocity with forward Euler from t=1 (noise) to t=0 in ``num_inference_steps`` steps, running the
prefix once and reusing its keys/values for every step.

The attention pattern (big_vision's ``mask_ar``): image and language tokens attend to each other
bidirectionally; the state token starts a block the prefix cannot see; the action tokens start another
block that sees everything before it. pi05 (``PI05FlowModel``) drops the state token (its state is in the
prompt) and feeds the time to the expert through adaptive RMSNorm instead of mixing it into the action
tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.policies.common.flow_matching import (
    euler_integrate,
    sample_beta_time,
    sample_flow_noise,
    sinusoidal_time_embedding,
)
from lerobot_cli.policies.common.masks import attention_mask_2d
from lerobot_cli.policies.common.paligemma.backbone import PaliGemmaWithExpert
from lerobot_cli.policies.common.paligemma.config import PiFlowConfig
from lerobot_cli.policies.common.paligemma.variants import GEMMA_VARIANTS, VISION_VARIANTS


def _as_input_of(layer: nn.Linear, x: Tensor) -> Tensor:
    """``x`` in ``layer``'s weight dtype. The projections stay fp32 under ``dtype=bfloat16`` (as LeRobot's),
    so this is a no-op there; an explicit FSDP ``param_dtype`` without autocast gathers them in low
    precision while states, noise and times arrive in fp32 (the root does not cast its inputs)."""
    return x.to(layer.weight.dtype)


class PI0FlowModel(nn.Module):
    """The ``model`` of a pi0 policy: towers plus the state/action/time projections (LeRobot's names)."""

    uses_adarms: bool = False

    def __init__(self, config: PiFlowConfig) -> None:
        super().__init__()
        self.config = config
        expert = GEMMA_VARIANTS[config.action_expert_variant]
        self.paligemma_with_expert = PaliGemmaWithExpert(
            GEMMA_VARIANTS[config.paligemma_variant],
            expert,
            VISION_VARIANTS[config.vision_variant],
            config.image_resolution[0],
            expert_cond_dim=expert.width if self.uses_adarms else None,
        )
        self.action_in_proj = nn.Linear(config.max_action_dim, expert.width)
        self.action_out_proj = nn.Linear(expert.width, config.max_action_dim)
        self._build_time_path(expert.width)

    def _build_time_path(self, width: int) -> None:
        self.state_proj = nn.Linear(self.config.max_state_dim, width)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)

    # -- sampling the training noise and time -----------------------------------------------------
    def sample_noise(self, shape: Sequence[int], device: torch.device) -> Tensor:
        return sample_flow_noise(shape, device)

    def sample_time(self, batch_size: int, device: torch.device) -> Tensor:
        """``Beta(alpha, beta) * scale + offset`` with the config's ``time_sampling_*``."""
        c = self.config
        return sample_beta_time(
            batch_size,
            device,
            alpha=c.time_sampling_beta_alpha,
            beta=c.time_sampling_beta_beta,
            scale=c.time_sampling_scale,
            offset=c.time_sampling_offset,
        )

    # -- token embeddings -------------------------------------------------------------------------
    def embed_prefix(
        self, images: Sequence[Tensor], image_masks: Sequence[Tensor], tokens: Tensor, token_masks: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Image tokens of every camera, then language tokens; one bidirectional block."""
        embs, pads = [], []
        for image, present in zip(images, image_masks, strict=True):
            emb = self.paligemma_with_expert.embed_image(image)
            embs.append(emb)
            pads.append(present[:, None].expand(emb.shape[0], emb.shape[1]))
        embs.append(self.paligemma_with_expert.embed_language_tokens(tokens))
        pads.append(token_masks)
        embs_t, pads_t = torch.cat(embs, dim=1), torch.cat(pads, dim=1)
        return embs_t, pads_t, torch.zeros_like(pads_t)

    def _time_embedding(self, time: Tensor) -> Tensor:
        emb = sinusoidal_time_embedding(
            time, self.action_in_proj.out_features, self.config.min_period, self.config.max_period
        )
        return emb.to(dtype=time.dtype)

    def embed_suffix(
        self, state: Tensor | None, noisy_actions: Tensor, time: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """State token (its own block), then the action tokens (one more block); time mixed into each
        action token by an MLP. Returns embeddings, padding, block starts and the expert's norm condition."""
        state_emb = self.state_proj(_as_input_of(self.state_proj, state))[:, None, :]
        action_emb = self.action_in_proj(_as_input_of(self.action_in_proj, noisy_actions))
        time_emb = self._time_embedding(time)[:, None, :].expand_as(action_emb).to(action_emb.dtype)
        mixed = self.action_time_mlp_out(
            F.silu(self.action_time_mlp_in(torch.cat([action_emb, time_emb], dim=2)))
        )
        embs = torch.cat([state_emb, mixed], dim=1)
        return embs, *self._suffix_masks(embs, with_state=True), None

    def _suffix_masks(self, embs: Tensor, with_state: bool) -> tuple[Tensor, Tensor]:
        batch, length = embs.shape[:2]
        pads = torch.ones(batch, length, dtype=torch.bool, device=embs.device)
        starts = [1] * with_state + [1] + [0] * (self.config.chunk_size - 1)
        block_starts = torch.tensor(starts, dtype=embs.dtype, device=embs.device)[None, :].expand(
            batch, length
        )
        return pads, block_starts

    def _compute_dtype(self) -> torch.dtype:
        return self.paligemma_with_expert.language_model.layers[0].self_attn.q_proj.weight.dtype

    # -- training ---------------------------------------------------------------------------------
    def forward(
        self,
        images: Sequence[Tensor],
        image_masks: Sequence[Tensor],
        tokens: Tensor,
        token_masks: Tensor,
        state: Tensor | None,
        actions: Tensor,
        noise: Tensor,
        time: Tensor,
    ) -> Tensor:
        """Element-wise flow-matching loss ``(B, chunk_size, max_action_dim)``."""
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        u_t = noise - actions
        prefix, prefix_pads, prefix_starts = self.embed_prefix(images, image_masks, tokens, token_masks)
        suffix, suffix_pads, suffix_starts, cond = self.embed_suffix(state, x_t, time)
        if self._compute_dtype() == torch.bfloat16:
            prefix, suffix = prefix.to(torch.bfloat16), suffix.to(torch.bfloat16)
        pads = torch.cat([prefix_pads, suffix_pads], dim=1)
        mask = attention_mask_2d(
            pads, torch.cat([prefix_starts.to(suffix_starts.dtype), suffix_starts], dim=1)
        )
        positions = torch.cumsum(pads, dim=1) - 1
        (_, suffix_out), _ = self.paligemma_with_expert.run([prefix, suffix], mask, positions, (None, cond))
        v_t = self._velocity(suffix_out)
        return F.mse_loss(u_t, v_t, reduction="none")

    # -- inference --------------------------------------------------------------------------------
    @torch.no_grad()
    def sample_actions(
        self,
        images: Sequence[Tensor],
        image_masks: Sequence[Tensor],
        tokens: Tensor,
        token_masks: Tensor,
        state: Tensor | None,
        noise: Tensor | None = None,
        num_steps: int | None = None,
    ) -> Tensor:
        """``(B, chunk_size, max_action_dim)`` actions: Euler steps from ``noise`` at t=1 down to t=0."""
        steps = num_steps or self.config.num_inference_steps
        batch = tokens.shape[0]
        if noise is None:
            noise = self.sample_noise(
                (batch, self.config.chunk_size, self.config.max_action_dim), tokens.device
            )
        prefix, prefix_pads, prefix_starts = self.embed_prefix(images, image_masks, tokens, token_masks)
        if self._compute_dtype() == torch.bfloat16:
            prefix = prefix.to(torch.bfloat16)
        prefix_mask = attention_mask_2d(prefix_pads, prefix_starts)
        _, cache = self.paligemma_with_expert.run(
            [prefix, None], prefix_mask, torch.cumsum(prefix_pads, dim=1) - 1
        )

        return euler_integrate(
            noise, steps, lambda x_t, time: self.denoise_step(state, prefix_pads, cache, x_t, time)
        )

    def denoise_step(
        self, state: Tensor | None, prefix_pads: Tensor, cache, x_t: Tensor, time: Tensor
    ) -> Tensor:
        """The velocity at ``(x_t, time)``: suffix tokens attending to the cached prefix and to each other."""
        suffix, suffix_pads, suffix_starts, cond = self.embed_suffix(state, x_t, time)
        if self._compute_dtype() == torch.bfloat16:
            suffix = suffix.to(torch.bfloat16)
        batch, suffix_len = suffix_pads.shape
        to_prefix = prefix_pads[:, None, :].expand(batch, suffix_len, prefix_pads.shape[1])
        mask = torch.cat([to_prefix, attention_mask_2d(suffix_pads, suffix_starts)], dim=2)
        positions = prefix_pads.sum(dim=-1)[:, None] + torch.cumsum(suffix_pads, dim=1) - 1
        (_, suffix_out), _ = self.paligemma_with_expert.run(
            [None, suffix], mask, positions, (None, cond), cache
        )
        return self._velocity(suffix_out)

    def _velocity(self, suffix_out: Tensor) -> Tensor:
        """The action tokens' outputs projected to a velocity, returned in fp32 (the loss and Euler steps)."""
        actions_out = suffix_out[:, -self.config.chunk_size :].to(torch.float32)
        return self.action_out_proj(_as_input_of(self.action_out_proj, actions_out)).to(torch.float32)
