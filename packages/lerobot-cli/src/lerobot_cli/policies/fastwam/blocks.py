"""One DiT block of either FastWAM expert (Wan2.2's attention block), in two halves around the attention.

A block is AdaLN-modulated self-attention, cross-attention to the text context, and a GELU feed-forward:

    x ← x + g₁ · o(attend(rope(q(m₁(x))), rope(k(m₁(x))), v(m₁(x))))      m₁(x) = LN(x)·(1 + s₁) + b₁
    x ← x + cross(LN₃(x), context)
    x ← x + g₂ · ffn(LN₂(x)·(1 + s₂) + b₂)

with the six modulation terms (b₁, s₁, g₁, b₂, s₂, g₂) = ``modulation`` + the expert's time projection (one
per sample for the action DiT, one per token for the video DiT, whose first latent frame has timestep 0).
The self-attention is not the block's own: in the mixture of transformers the queries, keys and values of
both experts' block i are attended together (``mot.MoTLayer``), so a block exposes :meth:`DiTBlock.open`
(up to q, k, v) and :meth:`DiTBlock.close` (from the attended values on). ``forward`` is never called.

Arithmetic follows Wan: layer norms and RMS norms compute in fp32 and return the input dtype, linear inputs
are cast to the layer's weight dtype before the output projections, and the attention may run in fp32
(``fp32_attention``) whatever the weights' dtype. Attention width (heads × head size) may differ from the
hidden width: the action DiT (hidden 1024) attends in the video DiT's 24 × 128 heads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.policies.fastwam.attention import masked_attention
from lerobot_cli.policies.fastwam.rope import rotate


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale) + shift


def layer_norm_fp32(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """``norm(x)`` computed in fp32 (weights too) and returned in ``x``'s dtype, as Wan's norms do."""
    weight = None if norm.weight is None else norm.weight.float()
    bias = None if norm.bias is None else norm.bias.float()
    return F.layer_norm(x.float(), norm.normalized_shape, weight, bias, norm.eps).to(x.dtype)


class RMSNorm(nn.Module):
    """Wan's RMS norm: statistics in fp32, the result cast back to the input dtype, then scaled."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Projections(nn.Module):
    """q, k, v (hidden → heads·d), o (heads·d → hidden) and the RMS norms of q and k."""

    def __init__(self, hidden_dim: int, attention_dim: int, eps: float) -> None:
        super().__init__()
        self.q = nn.Linear(hidden_dim, attention_dim)
        self.k = nn.Linear(hidden_dim, attention_dim)
        self.v = nn.Linear(hidden_dim, attention_dim)
        self.o = nn.Linear(attention_dim, hidden_dim)
        self.norm_q = RMSNorm(attention_dim, eps)
        self.norm_k = RMSNorm(attention_dim, eps)

    def output(self, attended: Tensor) -> Tensor:
        return self.o(attended.to(self.o.weight.dtype))


class Carry(NamedTuple):
    """What :meth:`DiTBlock.close` needs from :meth:`DiTBlock.open`: the residual and the later modulation
    terms."""

    residual: Tensor
    gate_attention: Tensor
    shift_ffn: Tensor
    scale_ffn: Tensor
    gate_ffn: Tensor


class DiTBlock(nn.Module):
    """One expert's block i (see the module docstring). Parameter names are Wan's (LeRobot's state dict)."""

    def __init__(self, hidden_dim: int, num_heads: int, head_dim: int, ffn_dim: int, eps: float) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        attention_dim = num_heads * head_dim
        self.norm1 = nn.LayerNorm(hidden_dim, eps=eps, elementwise_affine=False)
        self.self_attn = Projections(hidden_dim, attention_dim, eps)
        self.norm3 = nn.LayerNorm(hidden_dim, eps=eps, elementwise_affine=True)
        self.cross_attn = Projections(hidden_dim, attention_dim, eps)
        self.norm2 = nn.LayerNorm(hidden_dim, eps=eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(hidden_dim, ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(ffn_dim, hidden_dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, hidden_dim) / hidden_dim**0.5)

    def modulation_terms(self, t_mod: Tensor) -> tuple[Tensor, ...]:
        """The six terms: ``t_mod`` ``(B, 6, D)`` gives ``(B, 1, D)`` each, ``(B, S, 6, D)`` gives
        ``(B, S, D)``."""
        terms = self.modulation.to(dtype=t_mod.dtype, device=t_mod.device) + t_mod
        if t_mod.ndim == 4:
            return tuple(term.squeeze(2) for term in terms.chunk(6, dim=2))
        return terms.chunk(6, dim=1)

    def open(
        self, x: Tensor, t_mod: Tensor, rope: Callable[[Tensor], Tensor]
    ) -> tuple[Tensor, Tensor, Tensor, Carry]:
        """Modulated norm, then q, k (RMS-normed, rotated by ``rope``) and v, each ``(B, S, heads·d)``."""
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self.modulation_terms(t_mod)
        h = modulate(layer_norm_fp32(self.norm1, x), shift_a, scale_a)
        attn = self.self_attn
        q = rope(attn.norm_q(attn.q(h)))
        k = rope(attn.norm_k(attn.k(h)))
        v = attn.v(h)
        return q, k, v, Carry(x, gate_a, shift_f, scale_f, gate_f)

    def close(
        self,
        carry: Carry,
        attended: Tensor,
        context: Tensor | None,
        context_mask: Tensor | None,
        fp32_attention: bool,
    ) -> Tensor:
        """The rest of the block from the attended values ``(B, S, heads·d)``; no cross-attention without
        context."""
        x = carry.residual + carry.gate_attention * self.self_attn.output(attended)
        if context is not None:
            normed = layer_norm_fp32(self.norm3, x)
            x = x + self.cross_attention(normed, context, context_mask, fp32_attention)
        h = modulate(layer_norm_fp32(self.norm2, x), carry.shift_ffn, carry.scale_ffn)
        return x + carry.gate_ffn * self.ffn(h)

    def cross_attention(
        self, x: Tensor, context: Tensor, context_mask: Tensor | None, fp32_attention: bool
    ) -> Tensor:
        """Attention from the tokens to the text context; ``context_mask`` ``(B, S, L)`` or
        ``(B, 1, S, L)``."""
        if context_mask is not None and context_mask.dim() == 3:
            context_mask = context_mask.unsqueeze(1)
        attn, b, width = self.cross_attn, x.size(0), self.num_heads * self.head_dim
        q = attn.norm_q(attn.q(x)).view(b, -1, width)
        k = attn.norm_k(attn.k(context)).view(b, -1, width)
        v = attn.v(context).view(b, -1, width)
        return attn.output(masked_attention(q, k, v, self.num_heads, context_mask, fp32_attention))


def rope_for(phasors: Tensor, num_heads: int, out_dtype: torch.dtype | None) -> Callable[[Tensor], Tensor]:
    """The rotation an expert applies to q and k (see ``rope.rotate``)."""
    return lambda x: rotate(x, phasors, num_heads, out_dtype)
