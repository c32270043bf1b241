"""The decoder layers of the two Gemma towers and the joint attention that couples them.

pi0 and pi05 run layer i of the PaliGemma language model and layer i of the action expert as one attention
over the concatenated token sequence: each tower normalises and projects its own tokens, the
queries/keys/values are concatenated, attention runs once, and each tower applies its own output
projection and MLP to its slice. So a layer's ``forward`` is never what runs; :meth:`PaliGemmaLayer.joint`
is, and it takes the expert's layer i as an argument.

That is what sharding has to know: under FSDP2 the two layers are one unit (``fully_shard([vlm_i,
expert_i])``) and ``joint`` is registered as that unit's forward method, so calling it all-gathers both
layers' parameters and its backward reduce-scatters both. The policy declares this with
``_fsdp_unit_groups`` and the layer class with ``_fsdp_forward_methods`` (see lerobot_parallel.wrap_units).

Attribute names (``self_attn.q_proj``, ``mlp.gate_proj``, ``input_layernorm.weight``/``.dense``) are
LeRobot's, so state-dict keys equal LeRobot's. The arithmetic follows LeRobot 0.6.1 / openpi step for step
(fp32 RMS statistics, eager attention with an additive mask, rotary on the concatenated sequence), so
the same weights give the same loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn
from transformers.models.gemma.modeling_gemma import GemmaMLP, apply_rotary_pos_emb

# openpi's additive mask value for blocked positions (finite, so a fully masked row stays finite).
ATTENTION_MASK_VALUE = -2.3819763e38


class AdaRMSNorm(nn.Module):
    """Gemma's RMSNorm (scale ``1 + weight``); with ``cond_dim`` the adaptive form pi05 uses in the expert.

    Adaptive: a zero-initialised ``dense`` maps the condition (pi05: the flow time embedding) to a
    scale, shift and residual gate; ``forward`` returns ``(normed, gate)`` with gate ``None`` otherwise.
    """

    def __init__(self, dim: int, eps: float = 1e-6, cond_dim: int | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.cond_dim = cond_dim
        if cond_dim is None:
            self.weight = nn.Parameter(torch.zeros(dim))
            self.dense = None
        else:
            self.dense = nn.Linear(cond_dim, 3 * dim, bias=True)
            nn.init.zeros_(self.dense.weight)
            self.dense.zero_init = True

    def forward(self, x: Tensor, cond: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        variance = x.float().square().mean(dim=-1, keepdim=True)
        normed = x * torch.rsqrt(variance + self.eps)  # fp32: the statistics never run in bf16
        if self.dense is None:
            return (normed * (1.0 + self.weight.float())).type_as(x), None
        if cond is None:
            raise ValueError("an adaptive RMSNorm needs its condition (the time embedding)")
        # dtype=bfloat16 keeps the norms (their dense too) in fp32 while the condition comes from bf16 layers
        modulation = self.dense(cond.to(self.dense.weight.dtype))
        scale, shift, gate = (modulation.unsqueeze(1) if x.dim() == 3 else modulation).chunk(3, dim=-1)
        return (normed * (1.0 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


class GemmaProjections(nn.Module):
    """Gemma attention's four projections (no bias); the attention itself is joint,
    see :func:`joint_layer`."""

    def __init__(self, width: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.scaling = head_dim**-0.5
        self.q_proj = nn.Linear(width, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(width, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(width, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, width, bias=False)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(B, heads, T, head_dim)`` queries and ``(B, kv_heads, T, head_dim)`` keys and values."""
        shape = (*x.shape[:-1], -1, self.head_dim)
        return tuple(proj(x).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))


class PiGemmaLayer(nn.Module):
    """One Gemma decoder layer's parameters: pre-attention norm, projections, post-attention norm, MLP."""

    def __init__(self, hf_config, cond_dim: int | None = None) -> None:
        super().__init__()
        self.self_attn = GemmaProjections(
            hf_config.hidden_size,
            hf_config.num_attention_heads,
            hf_config.num_key_value_heads,
            hf_config.head_dim,
        )
        self.mlp = GemmaMLP(hf_config)
        self.input_layernorm = AdaRMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, cond_dim)
        self.post_attention_layernorm = AdaRMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, cond_dim)

    def forward(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__name__} runs jointly with its partner layer; call PaliGemmaLayer.joint"
        )


class ExpertLayer(PiGemmaLayer):
    """Layer i of the action expert; it runs inside :meth:`PaliGemmaLayer.joint` of layer i."""


class PaliGemmaLayer(PiGemmaLayer):
    """Layer i of the PaliGemma language model; :meth:`joint` runs it together with expert layer i."""

    # Methods that lerobot_parallel registers as the FSDP unit's forward (they replace forward's hooks).
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("joint",)

    def joint(
        self,
        expert: ExpertLayer,
        hiddens: Sequence[Tensor | None],
        rotary: tuple[Tensor, Tensor],
        mask: Tensor,
        conds: Sequence[Tensor | None] = (None, None),
        cached: KeyValues | None = None,
    ) -> tuple[list[Tensor | None], KeyValues]:
        """Run this layer and ``expert`` over ``hiddens = [vlm tokens | None, expert tokens | None]``.

        ``rotary``: ``(cos, sin)`` for the tokens present, ``mask``: additive ``(B, 1, T_q, T_k)``,
        ``cached``: keys/values of earlier tokens (the prefix at inference). Returns the new hidden
        states (None where the input was None) and this call's keys/values, for caching.
        """
        return joint_layer((self, expert), hiddens, rotary, mask, conds, cached)


class KeyValues(NamedTuple):
    """Rotated keys and values ``(B, kv_heads, T, head_dim)`` of one joint layer, kept for later tokens.

    A NamedTuple, so FSDP's forward hooks see (and mixed precision casts) the tensors inside it."""

    keys: Tensor
    values: Tensor


def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scaling: float) -> Tensor:
    """Eager softmax attention with grouped key/value heads; ``(B, T_q, heads * head_dim)``."""
    repeats = q.shape[1] // k.shape[1]
    if repeats > 1:
        k = k.repeat_interleave(repeats, dim=1)
        v = v.repeat_interleave(repeats, dim=1)
    weights = torch.matmul(q, k.transpose(2, 3)) * scaling + mask
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(weights, v).transpose(1, 2).contiguous()
    return out.reshape(out.shape[0], out.shape[1], -1)


def joint_layer(
    layers: Sequence[PiGemmaLayer],
    hiddens: Sequence[Tensor | None],
    rotary: tuple[Tensor, Tensor],
    mask: Tensor,
    conds: Sequence[Tensor | None],
    cached: KeyValues | None,
) -> tuple[list[Tensor | None], KeyValues]:
    """One joint-attention layer over the towers whose hidden states are not None (see module docstring)."""
    present = [i for i, h in enumerate(hiddens) if h is not None]
    normed, gates, qs, ks, vs = {}, {}, [], [], []
    for i in present:
        normed[i], gates[i] = layers[i].input_layernorm(hiddens[i], conds[i])
        q, k, v = layers[i].self_attn.qkv(normed[i])
        qs.append(q)
        ks.append(k)
        vs.append(v)
    cos, sin = rotary
    q, k = apply_rotary_pos_emb(torch.cat(qs, dim=2), torch.cat(ks, dim=2), cos, sin, unsqueeze_dim=1)
    v = torch.cat(vs, dim=2)
    new = KeyValues(k, v)
    if cached is not None:
        k = torch.cat([cached.keys, k], dim=2)
        v = torch.cat([cached.values, v], dim=2)
    attended = _attention(q, k, v, mask, layers[present[0]].self_attn.scaling)

    outputs: list[Tensor | None] = [None] * len(hiddens)
    start = 0
    for i in present:
        layer, h = layers[i], hiddens[i]
        end = start + h.shape[1]
        piece = attended[:, start:end].to(layer.self_attn.o_proj.weight.dtype)
        start = end
        h = _residual(h, layer.self_attn.o_proj(piece), gates[i])
        x, gate = layer.post_attention_layernorm(h, conds[i])
        x = layer.mlp(x.to(layer.mlp.up_proj.weight.dtype))
        outputs[i] = _residual(h, x, gate)
    return outputs, new


def _residual(x: Tensor, y: Tensor, gate: Tensor | None) -> Tensor:
    return x + y if gate is None else x + y * gate
