"""ACT's DETR-style transformer: encoder and decoder stacks with position embeddings added to q/k.

Sequences are ``(S, B, D)`` (batch second) as in ``nn.MultiheadAttention``'s default layout, and every
module and parameter name matches LeRobot's so checkpoints map one to one. ``ACTEncoderLayer`` and
``ACTDecoderLayer`` are the FSDP wrap units: each holds all parameters of one block.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.policies.act.config import ACTConfig

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


def _with_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    return x if pos is None else x + pos


def _attention(config: ACTConfig) -> nn.MultiheadAttention:
    return nn.MultiheadAttention(config.dim_model, config.n_heads, dropout=config.dropout)


def _feed_forward(config: ACTConfig) -> tuple[nn.Linear, nn.Dropout, nn.Linear]:
    """``linear1``, ``dropout``, ``linear2`` of a layer (in this order: it is the parameter order)."""
    return (
        nn.Linear(config.dim_model, config.dim_feedforward),
        nn.Dropout(config.dropout),
        nn.Linear(config.dim_feedforward, config.dim_model),
    )


def _norms(config: ACTConfig, sub_blocks: int) -> tuple[nn.LayerNorm, ...]:
    """``norm1``, ``norm2`` …: one LayerNorm per sub-block."""
    return tuple(nn.LayerNorm(config.dim_model) for _ in range(sub_blocks))


def _residual_dropouts(config: ACTConfig, sub_blocks: int) -> tuple[nn.Dropout, ...]:
    """``dropout1``, ``dropout2`` …: one Dropout on each sub-block's residual branch."""
    return tuple(nn.Dropout(config.dropout) for _ in range(sub_blocks))


class _ACTLayer(nn.Module):
    """What both layers share besides attention: the feed-forward sub-block and the pre-/post-norm switch.

    Each layer assigns its modules itself, attention first, then :func:`_feed_forward`, :func:`_norms`
    and :func:`_residual_dropouts`: LeRobot's attribute names in LeRobot's order, so state-dict keys,
    parameter order (the optimizer state's indices) and seeded initialisation are LeRobot's.
    """

    linear1: nn.Linear
    dropout: nn.Dropout
    linear2: nn.Linear

    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.activation = _ACTIVATIONS[config.feedforward_activation]
        self.pre_norm = config.pre_norm

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class ACTEncoderLayer(_ACTLayer):
    """Self-attention + feed-forward; post-norm by default, pre-norm with ``config.pre_norm``."""

    def __init__(self, config: ACTConfig) -> None:
        super().__init__(config)
        self.self_attn = _attention(config)
        self.linear1, self.dropout, self.linear2 = _feed_forward(config)
        self.norm1, self.norm2 = _norms(config, 2)
        self.dropout1, self.dropout2 = _residual_dropouts(config, 2)

    def forward(
        self, x: Tensor, pos_embed: Tensor | None = None, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        h = self.norm1(x) if self.pre_norm else x
        qk = _with_pos(h, pos_embed)
        x = x + self.dropout1(
            self.self_attn(qk, qk, value=h, key_padding_mask=key_padding_mask, need_weights=False)[0]
        )
        if self.pre_norm:
            return x + self.dropout2(self._feed_forward(self.norm2(x)))
        x = self.norm1(x)
        return self.norm2(x + self.dropout2(self._feed_forward(x)))


class ACTEncoder(nn.Module):
    """A stack of encoder layers (the VAE encoder is one too, with its own depth)."""

    def __init__(self, config: ACTConfig, is_vae_encoder: bool = False) -> None:
        super().__init__()
        self.is_vae_encoder = is_vae_encoder
        depth = config.n_vae_encoder_layers if is_vae_encoder else config.n_encoder_layers
        self.layers = nn.ModuleList(ACTEncoderLayer(config) for _ in range(depth))
        # Pre-norm layers leave their output un-normalised, so the stack normalises once at the end.
        self.norm = nn.LayerNorm(config.dim_model) if config.pre_norm else nn.Identity()

    def forward(
        self, x: Tensor, pos_embed: Tensor | None = None, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        for layer in self.layers:
            x = layer(x, pos_embed=pos_embed, key_padding_mask=key_padding_mask)
        return self.norm(x)


class ACTDecoderLayer(_ACTLayer):
    """Self-attention over the action queries, cross-attention into the encoder output, feed-forward."""

    def __init__(self, config: ACTConfig) -> None:
        super().__init__(config)
        self.self_attn = _attention(config)
        self.multihead_attn = _attention(config)
        self.linear1, self.dropout, self.linear2 = _feed_forward(config)
        self.norm1, self.norm2, self.norm3 = _norms(config, 3)
        self.dropout1, self.dropout2, self.dropout3 = _residual_dropouts(config, 3)

    def forward(
        self,
        x: Tensor,
        encoder_out: Tensor,
        decoder_pos_embed: Tensor | None = None,
        encoder_pos_embed: Tensor | None = None,
    ) -> Tensor:
        # Each sub-block: pre-norm normalises its input, post-norm normalises the residual sum.
        h = self.norm1(x) if self.pre_norm else x
        qk = _with_pos(h, decoder_pos_embed)
        x = x + self.dropout1(self.self_attn(qk, qk, value=h, need_weights=False)[0])
        if not self.pre_norm:
            x = self.norm1(x)

        h = self.norm2(x) if self.pre_norm else x
        attended = self.multihead_attn(
            query=_with_pos(h, decoder_pos_embed),
            key=_with_pos(encoder_out, encoder_pos_embed),
            value=encoder_out,
            need_weights=False,
        )[0]
        x = x + self.dropout2(attended)
        if not self.pre_norm:
            x = self.norm2(x)

        h = self.norm3(x) if self.pre_norm else x
        x = x + self.dropout3(self._feed_forward(h))
        return x if self.pre_norm else self.norm3(x)


class ACTDecoder(nn.Module):
    """A stack of decoder layers followed by a final LayerNorm (always, as in DETR)."""

    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ACTDecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.norm = nn.LayerNorm(config.dim_model)

    def forward(
        self,
        x: Tensor,
        encoder_out: Tensor,
        decoder_pos_embed: Tensor | None = None,
        encoder_pos_embed: Tensor | None = None,
    ) -> Tensor:
        for layer in self.layers:
            x = layer(
                x, encoder_out, decoder_pos_embed=decoder_pos_embed, encoder_pos_embed=encoder_pos_embed
            )
        return self.norm(x)
