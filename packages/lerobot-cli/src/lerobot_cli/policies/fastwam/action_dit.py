"""The action expert: FastWAM's 1 B action DiT outside its blocks (action, text, time embeddings, the head).

Its blocks live in the ``MoTLayer``s next to the video DiT's (:meth:`ActionDiT.make_blocks` builds them);
they attend in the video DiT's heads (24 × 128) from a narrower hidden width (1024), so the mixture can
attend over both experts' tokens at once. Actions are 1-D sequences with rotary positions 0 … horizon-1
and one timestep per sample. Everything here runs in the weights' dtype (LeRobot keeps no fp32 region in
this expert); the rotated q/k keep it too. Initial weights are torch's defaults, as LeRobot's (it has no
``init_weights`` here).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from lerobot_cli.policies.fastwam.blocks import DiTBlock
from lerobot_cli.policies.fastwam.rope import RopeTables, action_token_phasors, sinusoidal_embedding
from lerobot_cli.policies.fastwam.stream import ExpertInput


class ActionEmbedding(NamedTuple):
    stream: ExpertInput


class ActionDiT(nn.Module):
    """The action expert's own parameters (keys ``mot.mixtures.action.*`` in LeRobot's state dict)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.hidden_dim, self.action_dim = int(config["hidden_dim"]), int(config["action_dim"])
        self.ffn_dim, self.text_dim = int(config["ffn_dim"]), int(config["text_dim"])
        self.freq_dim, self.eps = int(config["freq_dim"]), float(config["eps"])
        self.num_heads, self.head_dim = int(config["num_heads"]), int(config["attn_head_dim"])
        self.num_layers = int(config["num_layers"])
        self.fp32_attention = bool(config.get("fp32_attention", True))
        self.use_gradient_checkpointing = bool(config.get("use_gradient_checkpointing", False))
        if self.head_dim % 2:
            raise ValueError(
                f"action DiT: attn_head_dim must be even for rotary embeddings, got {self.head_dim}"
            )
        d = self.hidden_dim
        self.action_encoder = nn.Linear(self.action_dim, d)
        self.text_embedding = nn.Sequential(
            nn.Linear(self.text_dim, d), nn.GELU(approximate="tanh"), nn.Linear(d, d)
        )
        self.time_embedding = nn.Sequential(nn.Linear(self.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.head = nn.Linear(d, self.action_dim)
        self.rope = RopeTables(self.head_dim, video=False)

    def make_blocks(self) -> list[DiTBlock]:
        return [
            DiTBlock(self.hidden_dim, self.num_heads, self.head_dim, self.ffn_dim, self.eps)
            for _ in range(self.num_layers)
        ]

    @property
    def model_dtype(self) -> torch.dtype:
        return self.action_encoder.weight.dtype

    def embed(
        self, actions: Tensor, timestep: Tensor, context: Tensor, context_mask: Tensor | None = None
    ) -> ActionEmbedding:
        """Tokens and per-forward constants from noisy actions ``(B, horizon, action_dim)``, timesteps
        ``(B,)`` (``(1,)`` broadcast in eval) and the text context ``(B, L, text_dim)`` with its mask
        ``(B, L)``."""
        if actions.ndim != 3 or actions.shape[2] != self.action_dim:
            raise ValueError(f"actions must be (B, horizon, {self.action_dim}), got {tuple(actions.shape)}")
        if timestep.ndim != 1:
            raise ValueError(f"timestep must be (B,) or (1,), got {tuple(timestep.shape)}")
        if context.ndim != 3:
            raise ValueError(f"context must be (B, L, D), got {tuple(context.shape)}")
        batch, seq_len = actions.shape[:2]
        if context.shape[0] != batch:
            raise ValueError(f"actions and context batch differ: {batch} vs {context.shape[0]}")
        if timestep.shape[0] not in (1, batch):
            raise ValueError(f"timestep length must be 1 or the batch size {batch}, got {timestep.shape[0]}")
        if timestep.shape[0] == 1 and batch > 1:
            if self.training:
                raise ValueError("in training every sample needs its own action timestep")
            timestep = timestep.expand(batch)
        if context_mask is None:
            context_mask = torch.ones((batch, context.shape[1]), dtype=torch.bool, device=context.device)
        elif tuple(context_mask.shape) != (batch, context.shape[1]):
            raise ValueError(
                f"context_mask must be (B, L) = {(batch, context.shape[1])}, got {tuple(context_mask.shape)}"
            )
        dtype = self.model_dtype
        actions, context = actions.to(dtype), context.to(dtype)
        t = self.time_embedding(sinusoidal_embedding(self.freq_dim, timestep).to(dtype))
        t_mod = self.time_projection(t).unflatten(1, (6, self.hidden_dim))
        tokens = self.action_encoder(actions)
        context = self.text_embedding(context)
        context_mask = context_mask.unsqueeze(1).expand(-1, seq_len, -1)
        phasors = action_token_phasors(self.rope.on(tokens.device), seq_len)
        stream = ExpertInput(tokens, t_mod, phasors, None, context, context_mask)
        return ActionEmbedding(stream)

    def unembed(self, tokens: Tensor, embedding: ActionEmbedding | None = None) -> Tensor:
        """The last layer's tokens → the velocity of each action step ``(B, horizon, action_dim)``."""
        return self.head(tokens)
