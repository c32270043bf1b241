"""SmolVLA's attention step, LeRobot 0.6.1's arithmetic in LeRobot's operation order (so fp32 is bit-equal).

RoPE (``max_wavelength`` 10 000, half-split), eager attention in fp32 with ``finfo.min`` masking, the joint
self-attention of a VLM layer and its expert layer (one softmax over the prefix and the suffix keys), the
expert's cross-attention to the VLM layer's keys and values, and :func:`joint_layer`, which runs one pair
of layers through its attention and both MLPs. Kept apart from ``expert.py`` (the module tree and its
FSDP unit classes) because this is the numerics LeRobot's results depend on, and the tree is not.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn


class KeyValues(NamedTuple):
    """One layer's rotated prefix keys and values ``(B, kv_heads, L, head_dim)`` (a NamedTuple, so FSDP's
    hooks see the tensors inside it)."""

    keys: Tensor
    values: Tensor


def apply_rope(x: Tensor, positions: Tensor, max_wavelength: int = 10_000) -> Tensor:
    """RoPE of positions ``(B, L)`` on ``x`` ``(B, L, H, D)``, half-split, computed in fp32 (LeRobot's)."""
    d_half = x.shape[-1] // 2
    dtype = x.dtype
    x = x.to(torch.float32)
    freq_exponents = (2.0 / x.shape[-1]) * torch.arange(d_half, dtype=torch.float32, device=x.device)
    timescale = max_wavelength**freq_exponents
    radians = positions[..., None].to(torch.float32) / timescale[None, None, :].to(torch.float32)
    radians = radians[..., None, :]
    sin, cos = torch.sin(radians), torch.cos(radians)
    x1, x2 = x.split(d_half, dim=-1)
    out = torch.empty_like(x)
    out[..., :d_half] = x1 * cos - x2 * sin
    out[..., d_half:] = x2 * cos + x1 * sin
    return out.to(dtype)


class AttentionHeads(NamedTuple):
    """The VLM's attention shape, which the joint attention uses for both towers (LeRobot's)."""

    heads: int
    kv_heads: int
    head_dim: int


def eager_attention(heads: AttentionHeads, mask: Tensor, batch_size: int, q: Tensor, k: Tensor, v: Tensor):
    """Eager attention in fp32 over ``(B, L, H, D)`` inputs, GQA heads repeated (LeRobot's order)."""
    num_heads, kv_heads, head_dim = heads
    groups = num_heads // kv_heads
    length = k.shape[1]
    k = k[:, :, :, None, :].expand(batch_size, length, kv_heads, groups, head_dim)
    k = k.reshape(batch_size, length, kv_heads * groups, head_dim)
    v = v[:, :, :, None, :].expand(batch_size, length, kv_heads, groups, head_dim)
    v = v.reshape(batch_size, length, kv_heads * groups, head_dim)
    q = q.to(dtype=torch.float32).transpose(1, 2)
    k = k.to(dtype=torch.float32).transpose(1, 2)
    weights = torch.matmul(q, k.transpose(2, 3))
    weights = weights * head_dim**-0.5  # out of place: selective checkpointing keeps the matmul's output
    weights = weights.to(dtype=torch.float32)
    masked = torch.where(mask[:, None, :, :], weights, torch.finfo(weights.dtype).min)
    probs = nn.functional.softmax(masked, dim=-1).to(dtype=v.dtype)
    out = torch.matmul(probs, v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
    return out.reshape(batch_size, -1, kv_heads * groups * head_dim)


def _qkv(layer: nn.Module, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    hidden = layer.input_layernorm(hidden)
    shape = (*hidden.shape[:-1], -1, layer.self_attn.head_dim)
    hidden = hidden.to(dtype=layer.self_attn.q_proj.weight.dtype)
    attn = layer.self_attn
    return (
        attn.q_proj(hidden).view(shape),
        attn.k_proj(hidden).view(shape),
        attn.v_proj(hidden).view(shape),
    )


def _self_attention(
    pair: tuple[nn.Module, nn.Module | None],
    embeds: list[Tensor | None],
    position_ids: Tensor,
    mask: Tensor,
    heads: AttentionHeads,
    batch_size: int,
    cached: KeyValues | None,
) -> tuple[list[Tensor], KeyValues]:
    """Joint self-attention of the present streams (one output over their concatenated tokens), and this
    call's rotated keys and values ``(B, kv_heads, L, D)`` (the prefix cache's entry)."""
    qs, ks, vs = [], [], []
    for layer, hidden in zip(pair, embeds, strict=True):
        if hidden is None or layer is None:
            continue
        q, k, v = _qkv(layer, hidden)
        qs.append(q)
        ks.append(k)
        vs.append(v)
    q, k, v = torch.cat(qs, dim=1), torch.cat(ks, dim=1), torch.cat(vs, dim=1)
    length = q.shape[1]
    if length < position_ids.shape[1]:
        position_ids, mask = position_ids[:, :length], mask[:, :length, :length]
    q, k = apply_rope(q, position_ids), apply_rope(k, position_ids)
    new = KeyValues(k.transpose(1, 2), v.transpose(1, 2))
    if cached is not None:
        cached_k, cached_v = cached
        k = torch.cat([cached_k, k.transpose(1, 2)], dim=-2).transpose(1, 2)
        v = torch.cat([cached_v, v.transpose(1, 2)], dim=-2).transpose(1, 2)
    return [eager_attention(heads, mask, batch_size, q, k, v)], new


def _cross_attention(
    pair: tuple[nn.Module, nn.Module | None],
    embeds: list[Tensor | None],
    position_ids: Tensor,
    mask: Tensor,
    heads: AttentionHeads,
    batch_size: int,
    cached: KeyValues | None,
) -> list[Tensor | None]:
    """The VLM attends to itself; the expert attends to the VLM's keys/values of this layer only."""
    outputs: list[Tensor | None] = []
    if cached is None:
        prefix_len = embeds[0].shape[1]
        prefix_positions, expert_positions = position_ids[:, :prefix_len], position_ids[:, prefix_len:]
        q, k, v = _qkv(pair[0], embeds[0])
        q, k = apply_rope(q, prefix_positions), apply_rope(k, prefix_positions)
        outputs.append(eager_attention(heads, mask[:, :prefix_len, :prefix_len], batch_size, q, k, v))
    else:
        expert_positions = position_ids
        cached_k, cached_v = cached
        k, v = cached_k.transpose(1, 2), cached_v.transpose(1, 2)
    expert = pair[1]
    if expert is None:
        outputs.append(None)
        return outputs
    hidden = expert.input_layernorm(embeds[1])
    attn = expert.self_attn
    hidden = hidden.to(dtype=attn.q_proj.weight.dtype)
    q = attn.q_proj(hidden).view(*hidden.shape[:-1], -1, attn.head_dim)
    k = k.to(dtype=attn.k_proj.weight.dtype).reshape(*k.shape[:2], -1)
    k = attn.k_proj(k).view(*k.shape[:-1], -1, attn.head_dim)
    v = v.to(dtype=attn.v_proj.weight.dtype).reshape(*v.shape[:2], -1)
    v = attn.v_proj(v).view(*v.shape[:-1], -1, attn.head_dim)
    expert_positions = expert_positions - torch.min(expert_positions, dim=1, keepdim=True).values
    expert_mask = mask[:, -embeds[1].shape[1] :, : k.shape[1]]
    q = apply_rope(q, expert_positions)
    outputs.append(eager_attention(heads, expert_mask, batch_size, q, k, v))
    return outputs


def joint_layer(
    pair: tuple[nn.Module, nn.Module | None],
    embeds: list[Tensor | None],
    position_ids: Tensor,
    mask: Tensor,
    heads: AttentionHeads,
    *,
    self_attention: bool,
    cached: KeyValues | None = None,
    fill_cache: bool = False,
) -> tuple[list[Tensor | None], KeyValues | None]:
    """VLM layer i and its expert layer (or None) over ``[prefix, suffix]`` (either may be None): the
    attention (joint self-attention, or the expert's cross-attention to this VLM layer's keys/values), then
    each tower's output projection, residual, norm and MLP. Returns the new embeddings and, with
    ``fill_cache``, this layer's prefix keys/values (else None). LeRobot's layer loop body, as is."""
    batch_size = next(h for h in embeds if h is not None).shape[0]
    new_kv = None
    if self_attention:
        outputs, new_kv = _self_attention(pair, embeds, position_ids, mask, heads, batch_size, cached)
    else:
        outputs = _cross_attention(pair, embeds, position_ids, mask, heads, batch_size, cached)
    new_embeds: list[Tensor | None] = []
    start = 0
    for i, (layer, hidden) in enumerate(zip(pair, embeds, strict=True)):
        out = outputs[i] if i < len(outputs) else outputs[0]
        if hidden is None:
            new_embeds.append(None)
            continue
        if layer is None:
            new_embeds.append(hidden)
            continue
        end = start + hidden.shape[1]
        if out.dtype != layer.self_attn.o_proj.weight.dtype:
            out = out.to(layer.self_attn.o_proj.weight.dtype)
        h = layer.self_attn.o_proj(out[:, start:end])
        # out of place (selective checkpointing keeps o_proj's and the MLP's outputs, see eager_attention),
        # in h's dtype as LeRobot's in-place adds: the same values
        h = (h + hidden).to(h.dtype)
        residual = h.clone()
        h = layer.post_attention_layernorm(h)
        h = layer.mlp(h)
        h = (h + residual).to(h.dtype)
        new_embeds.append(h)
        start = end if len(outputs) == 1 else 0
    return new_embeds, (new_kv if fill_cache else None)
