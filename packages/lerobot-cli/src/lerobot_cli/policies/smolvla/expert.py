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

Sharding: VLM text layer i and the expert layer paired with it run in one call, ``SmolVLMLayer.joint`` (the
joint attention, or the expert's cross-attention to VLM layer i's keys and values, then both towers' MLPs),
so under FSDP2 the pair is one unit (``fully_shard([vlm_i, expert_i])``, ``joint`` registered as its forward
method) and calling ``joint`` gathers both. The layers stay transformers' ``LlamaDecoderLayer`` objects (same
parameters and keys); their class is swapped for a subclass naming the role (``SmolVLMLayer``,
``SmolExpertLayer``, ``SmolVLMSoloLayer`` for a VLM layer no expert layer is paired with), which is what the
policy spec's ``wrap_units``/``unit_groups`` name; so are the token embedding's and the unread ``lm_head``'s
(``SmolVLMTokenEmbedding``, ``UnusedLMHead``: units of their own, out of the always-gathered root).

The key/value cache of inference is a plain per-layer list: the prefix's keys and values are written once;
a denoising step concatenates its own to them in self-attention layers without storing them (LeRobot
appends and then crops, the same values).
"""

from __future__ import annotations

import copy
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

# The prefix cache: per layer (keys, values), each (B, heads, L, head_dim) as transformers' DynamicCache.
PrefixCache = list["KeyValues"]


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


class KeyValues(NamedTuple):
    """One layer's rotated prefix keys and values ``(B, kv_heads, L, head_dim)`` (a NamedTuple, so FSDP's
    hooks see the tensors inside it)."""

    keys: Tensor
    values: Tensor


class _SmolLayer(LlamaDecoderLayer):
    """A SmolVLA decoder layer: transformers' ``LlamaDecoderLayer`` (same parameters and state-dict keys)
    whose ``forward`` never runs; its class name says its role, which the FSDP plan reads."""

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} runs inside SmolVLMLayer.joint, never through forward()")


class SmolVLMLayer(_SmolLayer):
    """VLM text layer i; :meth:`joint` runs it with its expert layer (or none): one FSDP unit."""

    # Methods that lerobot_parallel registers as the FSDP unit's forward (they gather the unit).
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("joint",)

    def joint(self, expert: nn.Module | None, embeds, position_ids, mask, heads, **kwargs):
        return joint_layer((self, expert), embeds, position_ids, mask, heads, **kwargs)


class SmolVLMSoloLayer(SmolVLMLayer):
    """A VLM text layer no expert layer is paired with (``num_expert_layers`` < ``num_vlm_layers``): a unit
    of its own (another class name, so the VLM and expert layers the plan pairs by order count alike)."""


class SmolExpertLayer(_SmolLayer):
    """Expert layer j; it runs inside the ``joint`` of the VLM layer it is paired with."""


class SmolVLMTokenEmbedding(nn.Embedding):
    """The VLM's token embedding (``nn.Embedding``, same parameter and key), its own FSDP unit: gathered only
    while it embeds the task tokens instead of all step long with the root (49,280 x 960 at full size)."""


class UnusedLMHead(nn.Linear):
    """The VLM's ``lm_head`` (``nn.Linear``, same parameter and key): in LeRobot's files, read by no
    computation. Its own FSDP unit, one that never runs forward, so it is never all-gathered."""

    def forward(self, x: Tensor) -> Tensor:
        raise RuntimeError(
            "SmolVLA never runs the VLM's lm_head; it is kept only for LeRobot's checkpoint keys"
        )


def _recast(module: nn.Module, cls: type[nn.Module], base: type[nn.Module] = LlamaDecoderLayer) -> None:
    """Give ``module``, a ``base``, its subclass ``cls`` (parameters, buffers and keys unchanged)."""
    if type(module) is not base:
        raise TypeError(
            f"SmolVLA needs a Llama text model (LeRobot calls its layers' parts directly); this SmolVLM has "
            f"a {type(module).__name__} where a {base.__name__} belongs"
        )
    module.__class__ = cls


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
        load_vlm_weights: bool = False,
    ) -> None:
        super().__init__()
        from transformers import AutoModel, SmolVLMForConditionalGeneration

        if load_vlm_weights:  # LeRobot's from_pretrained in bf16 (see vlm_weights.py); the weights come after
            from lerobot_cli.policies.smolvla.vlm_weights import pretrained_build, pretrained_vlm_config

            vlm_config = pretrained_vlm_config(copy.deepcopy(vlm_config))
            with pretrained_build():
                self.vlm = SmolVLMForConditionalGeneration(config=vlm_config)
        else:
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
        # Each layer's role in its class name (the parameters and keys stay transformers'): the FSDP plan
        # pairs the i-th SmolVLMLayer with the i-th SmolExpertLayer (see PolicySpec.unit_groups).
        for vlm_layer, expert_layer in self.layer_pairs():
            _recast(vlm_layer, SmolVLMSoloLayer if expert_layer is None else SmolVLMLayer)
        for layer in self.lm_expert.layers:
            _recast(layer, SmolExpertLayer)
        embed = text_model.embed_tokens
        if self.vlm.lm_head.weight is not embed.weight:  # tied (tie_word_embeddings), both stay in the root
            _recast(embed, SmolVLMTokenEmbedding, nn.Embedding)
            _recast(self.vlm.lm_head, UnusedLMHead, nn.Linear)

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
        """LeRobot's ``vision_model(pixel_values, patch_attention_mask=None)``, without its host sync.

        With no patch mask, transformers' vision model builds an all-true one and then asks whether it is
        all true (``padding_mask.all()`` in ``create_bidirectional_mask``), a device-to-host read on every
        camera of every step. Every patch of a resized image is real, so the encoder runs with no mask,
        which is what that check concludes (for eager attention it would add a mask of zeros: the same
        numbers); the position ids still come from the all-true patch mask, as in transformers."""
        vision = self.vlm_model().vision_model
        pixels = image.to(dtype=vision.dtype)
        side = vision.config.patch_size
        patches = torch.ones(
            (pixels.shape[0], pixels.shape[2] // side, pixels.shape[3] // side),
            dtype=torch.bool,
            device=pixels.device,
        )
        hidden = vision.embeddings(pixel_values=pixels, patch_attention_mask=patches)
        hidden = vision.encoder(inputs_embeds=hidden, attention_mask=None).last_hidden_state
        return self.vlm_model().connector(vision.post_layernorm(hidden))

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
        if fill_cache:
            cache = []
        heads = AttentionHeads(self.num_attention_heads, self.num_key_value_heads, self.head_dim)
        for index, (vlm_layer, expert_layer) in enumerate(self.layer_pairs()):
            # One call per VLM layer i, with its expert layer: under FSDP2 the pair is one unit and this
            # call gathers both (``joint`` is the unit's registered forward method).
            embeds, kv = vlm_layer.joint(
                expert_layer,
                embeds,
                position_ids,
                mask,
                heads,
                self_attention=fill_cache or self.is_self_attention_layer(index),
                cached=None if cache is None or fill_cache else cache[index],
                fill_cache=fill_cache,
            )
            if fill_cache:
                cache.append(kv)
        norms = (self.vlm_model().text_model.norm, self.lm_expert.norm)
        return [None if h is None else norm(h) for norm, h in zip(norms, embeds, strict=True)], cache
