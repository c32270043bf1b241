"""The video expert: Wan2.2-TI2V-5B's DiT outside its blocks (patch, text and time embeddings, the head).

Its 30 blocks live in the ``MoTLayer``s (one owner per parameter for FSDP); :meth:`VideoDiT.make_blocks`
builds them. :meth:`VideoDiT.embed` turns VAE latents ``(B, C, T, H, W)``, timesteps and the text context
into the tokens and constants every layer reads; :meth:`VideoDiT.unembed` turns the last layer's tokens back
into a latent-shaped velocity. The first latent frame is the clean conditioning image: its tokens get
timestep 0 (Wan's separated timesteps with the image fused into the latents).

Precision as LeRobot runs it on CUDA: the sinusoidal time embedding, ``time_embedding``, ``time_projection``
and the head compute in fp32 whatever the weights' dtype (Wan's fp32 autocast regions; here explicit fp32
casts with autocast off, which gives the same numbers and also holds on CPU and under an outer bf16
autocast); the modulation terms go back to the weights' dtype for the blocks; the head's output stays fp32.

Initial weights follow Wan's ``init_weights`` distributions (Xavier-uniform linears with zero biases,
N(0, 0.02) text and time embeddings, a zero output projection); the random draws are not LeRobot's own
sequence, whose checkpoints are loaded instead.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.policies.fastwam.attention import group_causal_mask, video_self_mask
from lerobot_cli.policies.fastwam.blocks import DiTBlock
from lerobot_cli.policies.fastwam.rope import RopeTables, sinusoidal_embedding, video_token_phasors
from lerobot_cli.policies.fastwam.stream import ExpertInput


class Fp32Linear(nn.Linear):
    """A linear layer computing in fp32 whatever its weights' dtype: input, weight and bias upcast (what an
    fp32 autocast region computes).

    The upcast lives in ``forward`` so the layer always runs through its own ``__call__``: FSDP gathers a
    unit's parameters in a hook on that call, so a size rule (``--accelerator.fsdp.min_num_params``) that
    picks one of these layers as a unit still finds its weights gathered. Same parameters and names as
    ``nn.Linear``.
    """

    def forward(self, x: Tensor) -> Tensor:
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias)


class VideoHead(nn.Module):
    """Modulated fp32 norm and projection to ``out_dim`` channels per patch element."""

    def __init__(self, hidden_dim: int, out_features: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_dim, eps=eps, elementwise_affine=False)
        self.head = Fp32Linear(hidden_dim, out_features)
        self.modulation = nn.Parameter(torch.randn(1, 2, hidden_dim) / hidden_dim**0.5)

    def project(self, x: Tensor, t: Tensor) -> Tensor:
        """``x`` ``(B, S, D)`` with per-token time features ``t`` ``(B, S, D)`` (fp32) → fp32
        ``(B, S, out)``."""
        with torch.autocast(x.device.type, enabled=False):
            shift, scale = (self.modulation.unsqueeze(0) + t.unsqueeze(2)).chunk(2, dim=2)
            normed = F.layer_norm(x.float(), self.norm.normalized_shape, None, None, self.norm.eps)
            normed = normed.to(x.dtype)
            return self.head(normed * (1 + scale.squeeze(2)) + shift.squeeze(2))


class VideoEmbedding(NamedTuple):
    """``embed``'s result: the layers' input, the fp32 time features the head needs, and the latent grid."""

    stream: ExpertInput
    t: Tensor
    grid: tuple[int, int, int]
    tokens_per_frame: int


class VideoDiT(nn.Module):
    """The video expert's own parameters (keys ``mot.mixtures.video.*`` in LeRobot's state dict)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.hidden_dim = int(config["hidden_dim"])
        self.in_dim, self.out_dim = int(config["in_dim"]), int(config["out_dim"])
        self.ffn_dim, self.freq_dim = int(config["ffn_dim"]), int(config["freq_dim"])
        self.text_dim, self.eps = int(config["text_dim"]), float(config["eps"])
        self.patch_size = tuple(int(p) for p in config["patch_size"])
        self.num_heads, self.head_dim = int(config["num_heads"]), int(config["attn_head_dim"])
        self.num_layers = int(config["num_layers"])
        self.attention_mask_mode = str(config.get("video_attention_mask_mode", "bidirectional"))
        self.action_conditioned = bool(config.get("action_conditioned", False))
        self.action_dim = int(config.get("action_dim", 7))
        self.group_mask_mode = str(config.get("action_group_causal_mask_mode", "causal"))
        self.fp32_attention = bool(config.get("fp32_attention", True))
        self.use_gradient_checkpointing = bool(config.get("use_gradient_checkpointing", False))
        if self.head_dim * self.num_heads != self.hidden_dim:
            raise ValueError(
                f"video DiT: attn_head_dim × num_heads must equal hidden_dim, got "
                f"{self.head_dim} × {self.num_heads} ≠ {self.hidden_dim}"
            )
        d = self.hidden_dim
        self.patch_embedding = nn.Conv3d(self.in_dim, d, kernel_size=self.patch_size, stride=self.patch_size)
        self.text_embedding = nn.Sequential(
            nn.Linear(self.text_dim, d), nn.GELU(approximate="tanh"), nn.Linear(d, d)
        )
        self.time_embedding = nn.Sequential(Fp32Linear(self.freq_dim, d), nn.SiLU(), Fp32Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), Fp32Linear(d, 6 * d))
        self.head = VideoHead(d, math.prod(self.patch_size) * self.out_dim, self.eps)
        self._init_weights()
        if self.action_conditioned:  # built after Wan's init, so it keeps torch's default initialisation
            self.action_embedding = nn.Linear(self.action_dim, d)
        self.rope = RopeTables(self.head_dim, video=True)

    def _init_weights(self) -> None:
        _xavier_linears(self)
        nn.init.xavier_uniform_(self.patch_embedding.weight.flatten(1))
        for layer in (*self.text_embedding, *self.time_embedding):
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, std=0.02)
        nn.init.zeros_(self.head.head.weight)

    def make_blocks(self) -> list[DiTBlock]:
        """The expert's ``num_layers`` blocks, initialised as Wan's (owned by the MoT layers)."""
        blocks = [
            DiTBlock(self.hidden_dim, self.num_heads, self.head_dim, self.ffn_dim, self.eps)
            for _ in range(self.num_layers)
        ]
        for block in blocks:
            _xavier_linears(block)
        return blocks

    @property
    def model_dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    def self_attention_mask(self, seq_len: int, tokens_per_frame: int, device: torch.device) -> Tensor:
        return video_self_mask(self.attention_mask_mode, seq_len, tokens_per_frame, device)

    def embed(
        self,
        latents: Tensor,
        timestep: Tensor,
        context: Tensor,
        context_mask: Tensor | None = None,
        action: Tensor | None = None,
    ) -> VideoEmbedding:
        """Tokens and per-forward constants from latents ``(B, C, T, H, W)``, timesteps ``(B,)`` (or ``(1,)``
        in eval), text context ``(B, L, text_dim)`` with its mask ``(B, L)``, and (action-conditioned DiTs)
        actions."""
        latents, timestep, context_mask = self._checked(latents, timestep, context, context_mask, action)
        dtype = self.model_dtype
        latents, context = latents.to(dtype), context.to(dtype)
        batch, frames = latents.shape[0], latents.shape[2]
        ph, pw = self.patch_size[1], self.patch_size[2]
        if latents.shape[3] % ph or latents.shape[4] % pw:
            raise ValueError(
                f"latent height × width {tuple(latents.shape[3:])} must be divisible by the patch {(ph, pw)}"
            )
        tokens_per_frame = (latents.shape[3] // ph) * (latents.shape[4] // pw)
        # Every token carries its frame's timestep; the clean first frame's is 0 (in the weights' dtype, as
        # Wan).
        token_t = torch.ones((batch, frames, tokens_per_frame), dtype=dtype, device=timestep.device)
        token_t = token_t * timestep.to(dtype).view(batch, 1, 1)
        token_t[:, 0, :] = 0
        with torch.autocast(timestep.device.type, enabled=False):
            t_features = sinusoidal_embedding(self.freq_dim, token_t.reshape(-1)).float()
            t = self.time_embedding(t_features).reshape(batch, -1, self.hidden_dim)
            t_mod = self.time_projection(t).unflatten(2, (6, self.hidden_dim))
        t_mod = t_mod.to(dtype)

        x = self.patch_embedding(latents)
        grid = tuple(x.shape[2:])
        seq_len = math.prod(grid)
        context = self.text_embedding(context)
        if self.action_conditioned and action is not None:
            context, context_mask = self._with_actions(
                context, context_mask, action.to(dtype), grid, tokens_per_frame
            )
        else:
            context_mask = context_mask.unsqueeze(1).expand(-1, seq_len, -1)
        tokens = x.flatten(2).transpose(1, 2).contiguous()
        phasors = video_token_phasors(self.rope.on(tokens.device), *grid)
        stream = ExpertInput(tokens, t_mod, phasors, torch.float32, context, context_mask)
        return VideoEmbedding(stream, t, grid, tokens_per_frame)

    def _with_actions(
        self,
        context: Tensor,
        context_mask: Tensor,
        action: Tensor,
        grid: tuple[int, int, int],
        tokens_per_frame: int,
    ) -> tuple[Tensor, Tensor]:
        """Action-conditioned DiTs: the actions (embedded, plus sinusoidal step positions) join the context,
        and latent frame g + 1 sees the actions of transition g (or up to g) only."""
        batch, steps = action.shape[:2]
        emb = self.action_embedding(action)
        positions = sinusoidal_embedding(self.hidden_dim, torch.arange(steps, device=emb.device))
        positions = positions.to(emb.dtype)
        emb = emb + positions.unsqueeze(0)
        text_len = context.shape[1]
        context = torch.cat([context, emb], dim=1)
        groups = grid[0] - 1
        if groups <= 0:
            raise ValueError(
                "an action-conditioned video DiT needs at least 2 latent frames when actions are given"
            )
        if steps % groups:
            raise ValueError(f"{steps} actions cannot be split over {groups} latent transitions")
        groups_mask = group_causal_mask(groups, tokens_per_frame, steps // groups, self.group_mask_mode)
        seq_len = math.prod(grid)
        mask = torch.zeros((batch, seq_len, context.shape[1]), dtype=torch.bool, device=context.device)
        mask[:, :, :text_len] = context_mask.unsqueeze(1).expand(-1, seq_len, -1)
        groups_mask = groups_mask.to(context.device).unsqueeze(0).expand(batch, -1, -1)
        mask[:, tokens_per_frame:, text_len:] = groups_mask
        return context, mask

    def _checked(
        self,
        latents: Tensor,
        timestep: Tensor,
        context: Tensor,
        context_mask: Tensor | None,
        action: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """LeRobot's input contract: shapes, a default all-true context mask, and in eval one latent or one
        timestep broadcast over the batch."""
        if latents.ndim != 5:
            raise ValueError(f"video latents must be (B, C, T, H, W), got {tuple(latents.shape)}")
        if context.ndim != 3:
            raise ValueError(f"context must be (B, L, D), got {tuple(context.shape)}")
        if timestep.ndim != 1:
            raise ValueError(f"timestep must be (B,) or (1,), got {tuple(timestep.shape)}")
        frames = latents.shape[2]
        if self.action_conditioned and not (frames == 1 and action is None):
            if action is None or action.ndim != 3 or action.shape[2] != self.action_dim:
                raise ValueError(
                    f"an action-conditioned video DiT needs actions (B, horizon, {self.action_dim})"
                )
            if frames <= 1 or action.shape[1] % (frames - 1):
                raise ValueError(
                    f"the action horizon {action.shape[1]} must split over {frames - 1} latent transitions"
                )
        if context_mask is None:
            context_mask = torch.ones(context.shape[:2], dtype=torch.bool, device=context.device)
        elif tuple(context_mask.shape) != tuple(context.shape[:2]):
            raise ValueError(
                f"context_mask must be (B, L) = {tuple(context.shape[:2])}, got {tuple(context_mask.shape)}"
            )
        batch = latents.shape[0]
        if batch != context.shape[0]:
            if self.training or batch != 1:
                raise ValueError(f"latents and context batch differ: {batch} vs {context.shape[0]}")
            latents = latents.expand(context.shape[0], -1, -1, -1, -1)
            batch = context.shape[0]
        if timestep.shape[0] not in (1, batch):
            raise ValueError(f"timestep length must be 1 or the batch size {batch}, got {timestep.shape[0]}")
        if timestep.shape[0] == 1 and batch > 1:
            if self.training:
                raise ValueError("in training every sample needs its own timestep")
            timestep = timestep.expand(batch)
        return latents, timestep, context_mask

    def unembed(self, tokens: Tensor, embedding: VideoEmbedding) -> Tensor:
        """The last layer's tokens → fp32 velocity ``(B, out_dim, T·pt, H·ph, W·pw)``."""
        x = self.head.project(tokens, embedding.t)
        f, h, w = embedding.grid
        pt, ph, pw = self.patch_size
        x = x[:, : f * h * w].reshape(x.shape[0], f, h, w, pt, ph, pw, self.out_dim)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(x.shape[0], self.out_dim, f * pt, h * ph, w * pw)


def _xavier_linears(module: nn.Module) -> None:
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
