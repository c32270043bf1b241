"""SmolVLM with an action expert: LeRobot 0.6.1's ``SmolVLMWithExpertModel``, computed as LeRobot computes it.

The VLM is transformers' ``SmolVLMForConditionalGeneration`` built from ``vlm_model_name``'s config.json and
cut to its first ``num_vlm_layers`` text layers; the expert is the same text model (``AutoModel`` of a copy
of the text config) at ``expert_width_multiplier`` of its width, without token embedding. The module tree
and attribute names are LeRobot's, so the state dict is (``vlm.model.vision_model…``, ``vlm.lm_head``,
``lm_expert.layers.i…``).

Neither tower's ``forward`` runs: each layer's norms, projections and MLP are called directly, the VLM's and
the expert's tokens meeting in one attention (joint self-attention: one softmax over the prefix and the
suffix keys) or, with ``attention_mode=cross_attn``, every layer but each ``self_attn_every_n_layers``-th
one has the expert attend only to the VLM's (RoPE-rotated) keys and values of that layer, projected by the
expert's own ``k_proj``/``v_proj`` (whose input width is the VLM's key/value width). RoPE is LeRobot's
(``max_wavelength`` 10 000, half-split), attention eager in fp32 with ``finfo.min`` masking, in the same
operation order as LeRobot's, so fp32 results are bit-equal.

The key/value cache of inference is a plain per-layer list: the prefix's keys and values are written once;
a denoising step concatenates its own to them in self-attention layers without storing them (LeRobot
appends and then crops, the same values).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

# The prefix cache: per layer (keys, values), each (B, heads, L, head_dim) as transformers' DynamicCache.
PrefixCache = list[tuple[Tensor, Tensor]]


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


def expert_intermediate_size(hidden: int, ffn_multiplier: int = 4, multiple_of: int = 256) -> int:
    """The expert's MLP width for its hidden size (LeRobot's ``get_intermediate_size``)."""
    hidden = int(2 * hidden / 3)
    hidden = int(ffn_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class SmolVLMWithExpertModel(nn.Module):
    def __init__(
        self,
        vlm_config,
        *,
        attention_mode: str,
        num_expert_layers: int,
        num_vlm_layers: int,
        self_attn_every_n_layers: int,
        expert_width_multiplier: float,
    ) -> None:
        super().__init__()
        from transformers import AutoModel, SmolVLMForConditionalGeneration

        self.vlm = SmolVLMForConditionalGeneration(config=vlm_config)
        text_model = self.vlm.model.text_model
        if num_vlm_layers > 0:
            text_model.layers = text_model.layers[:num_vlm_layers]
        self.num_vlm_layers = len(text_model.layers)
        self.config = vlm_config
        text = vlm_config.text_config
        expert_config = copy.deepcopy(text)
        width = int(text.hidden_size * expert_width_multiplier)
        expert_config.hidden_size = width
        expert_config.intermediate_size = expert_intermediate_size(width)
        expert_config.num_hidden_layers = num_expert_layers if num_expert_layers > 0 else self.num_vlm_layers
        self.lm_expert = AutoModel.from_config(expert_config)
        self.num_expert_layers = len(self.lm_expert.layers)
        self.self_attn_every_n_layers = self_attn_every_n_layers
        self.attention_mode = attention_mode
        if self.cross_attention:
            # The expert's cross-attention layers read the VLM's keys/values: their k/v projections take the
            # VLM's key/value width (LeRobot replaces them, by expert layer index).
            for index, layer in enumerate(self.lm_expert.layers):
                if self_attn_every_n_layers > 0 and index % self_attn_every_n_layers == 0:
                    continue
                for name in ("k_proj", "v_proj"):
                    setattr(
                        layer.self_attn,
                        name,
                        nn.Linear(
                            text.num_key_value_heads * text.head_dim,
                            expert_config.num_key_value_heads * expert_config.head_dim,
                            bias=expert_config.attention_bias,
                        ),
                    )
        self.lm_expert.embed_tokens = None  # the expert reads embeddings, never tokens
        self.num_attention_heads = text.num_attention_heads
        self.num_key_value_heads = text.num_key_value_heads
        self.head_dim = text.head_dim
        self.expert_hidden_size = width

    @property
    def cross_attention(self) -> bool:
        return "cross" in self.attention_mode

    def vlm_model(self) -> nn.Module:
        return self.vlm.model

    def is_self_attention_layer(self, index: int) -> bool:
        n = self.self_attn_every_n_layers
        return not self.cross_attention or (n > 0 and index % n == 0)

    def unread_modules(self) -> list[nn.Module]:
        """What LeRobot freezes when it trains the VLM (``set_requires_grad``, against DDP's unused
        parameters): the ``lm_head`` and the text ``norm``, which nothing reads, and the whole last VLM
        layer (with a shallower expert, the one before it too), although in a cross-attention layer the
        expert reads that layer's keys and values: frozen here as well, so the same parameters train."""
        text_model = self.vlm.model.text_model
        modules = [self.vlm.lm_head, text_model.norm, text_model.layers[self.num_vlm_layers - 1]]
        if (
            self.num_vlm_layers != self.num_expert_layers
            and self.num_vlm_layers % self.num_expert_layers == 0
        ):
            modules.append(text_model.layers[self.num_vlm_layers - 2])
        return modules

    # -- embeddings --------------------------------------------------------------------------------
    def embed_image(self, image: Tensor) -> Tensor:
        vlm = self.vlm_model()
        hidden = vlm.vision_model(
            pixel_values=image.to(dtype=vlm.vision_model.dtype), patch_attention_mask=None
        ).last_hidden_state
        return vlm.connector(hidden)

    def embed_language_tokens(self, tokens: Tensor) -> Tensor:
        return self.vlm_model().text_model.get_input_embeddings()(tokens)

    # -- the joint layers --------------------------------------------------------------------------
    def layer_pairs(self) -> list[tuple[nn.Module, nn.Module | None]]:
        """(VLM layer i, the expert layer paired with it or None), LeRobot's ``get_model_layers``."""
        vlm_layers = self.vlm_model().text_model.layers
        every = self.num_vlm_layers // self.num_expert_layers
        pairs = []
        for i in range(self.num_vlm_layers):
            if every > 0 and i > 0 and i % every != 0:
                expert = None
            else:
                expert = self.lm_expert.layers[i // every if every > 0 else i]
            pairs.append((vlm_layers[i], expert))
        return pairs

    def attention(self, mask: Tensor, batch_size: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Eager attention in fp32 over ``(B, L, H, D)`` inputs, GQA heads repeated (LeRobot's order)."""
        heads, kv_heads, head_dim = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        groups = heads // kv_heads
        length = k.shape[1]
        k = k[:, :, :, None, :].expand(batch_size, length, kv_heads, groups, head_dim)
        k = k.reshape(batch_size, length, kv_heads * groups, head_dim)
        v = v[:, :, :, None, :].expand(batch_size, length, kv_heads, groups, head_dim)
        v = v.reshape(batch_size, length, kv_heads * groups, head_dim)
        q = q.to(dtype=torch.float32).transpose(1, 2)
        k = k.to(dtype=torch.float32).transpose(1, 2)
        weights = torch.matmul(q, k.transpose(2, 3))
        weights *= head_dim**-0.5
        weights = weights.to(dtype=torch.float32)
        masked = torch.where(mask[:, None, :, :], weights, torch.finfo(weights.dtype).min)
        probs = nn.functional.softmax(masked, dim=-1).to(dtype=v.dtype)
        out = torch.matmul(probs, v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        return out.reshape(batch_size, -1, kv_heads * groups * head_dim)

    @staticmethod
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

    def self_attention_layer(
        self,
        index: int,
        pair: tuple[nn.Module, nn.Module | None],
        embeds: list[Tensor | None],
        position_ids: Tensor,
        mask: Tensor,
        batch_size: int,
        cache: PrefixCache | None,
        fill_cache: bool,
    ) -> list[Tensor]:
        """Joint self-attention of the present streams (one output over their concatenated tokens)."""
        qs, ks, vs = [], [], []
        for layer, hidden in zip(pair, embeds, strict=True):
            if hidden is None or layer is None:
                continue
            q, k, v = self._qkv(layer, hidden)
            qs.append(q)
            ks.append(k)
            vs.append(v)
        q, k, v = torch.cat(qs, dim=1), torch.cat(ks, dim=1), torch.cat(vs, dim=1)
        length = q.shape[1]
        if length < position_ids.shape[1]:
            position_ids, mask = position_ids[:, :length], mask[:, :length, :length]
        q, k = apply_rope(q, position_ids), apply_rope(k, position_ids)
        if fill_cache:
            cache.append((k.transpose(1, 2), v.transpose(1, 2)))
        elif cache is not None:
            cached_k, cached_v = cache[index]
            k = torch.cat([cached_k, k.transpose(1, 2)], dim=-2).transpose(1, 2)
            v = torch.cat([cached_v, v.transpose(1, 2)], dim=-2).transpose(1, 2)
        return [self.attention(mask, batch_size, q, k, v)]

    def cross_attention_layer(
        self,
        index: int,
        pair: tuple[nn.Module, nn.Module | None],
        embeds: list[Tensor | None],
        position_ids: Tensor,
        mask: Tensor,
        batch_size: int,
        cache: PrefixCache | None,
    ) -> list[Tensor | None]:
        """The VLM attends to itself; the expert attends to the VLM's keys/values of this layer only."""
        outputs: list[Tensor | None] = []
        if cache is None:
            prefix_len = embeds[0].shape[1]
            prefix_positions, expert_positions = position_ids[:, :prefix_len], position_ids[:, prefix_len:]
            q, k, v = self._qkv(pair[0], embeds[0])
            q, k = apply_rope(q, prefix_positions), apply_rope(k, prefix_positions)
            outputs.append(self.attention(mask[:, :prefix_len, :prefix_len], batch_size, q, k, v))
        else:
            expert_positions = position_ids
            cached_k, cached_v = cache[index]
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
        outputs.append(self.attention(expert_mask, batch_size, q, k, v))
        return outputs

    def run(
        self,
        embeds: list[Tensor | None],
        mask: Tensor,
        position_ids: Tensor,
        cache: PrefixCache | None = None,
        fill_cache: bool = False,
    ) -> tuple[list[Tensor | None], PrefixCache | None]:
        """Both towers over ``[prefix, suffix]`` embeddings (either may be None), LeRobot's ``forward``.
        ``fill_cache``: a prefix pass that returns the cache; ``cache``: a suffix pass reading it."""
        batch_size = next(h for h in embeds if h is not None).shape[0]
        if fill_cache:
            cache = []
        for index, pair in enumerate(self.layer_pairs()):
            if fill_cache or self.is_self_attention_layer(index):
                outputs = self.self_attention_layer(
                    index, pair, embeds, position_ids, mask, batch_size, cache, fill_cache
                )
            else:
                outputs = self.cross_attention_layer(
                    index, pair, embeds, position_ids, mask, batch_size, cache
                )
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
                h += hidden
                residual = h.clone()
                h = layer.post_attention_layernorm(h)
                h = layer.mlp(h)
                h += residual
                new_embeds.append(h)
                start = end if len(outputs) == 1 else 0
            embeds = new_embeds
        norms = (self.vlm_model().text_model.norm, self.lm_expert.norm)
        return [None if h is None else norm(h) for norm, h in zip(norms, embeds, strict=True)], cache
