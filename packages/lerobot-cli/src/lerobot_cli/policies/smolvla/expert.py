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
operation order as LeRobot's, so fp32 results are bit-equal (``attention.py``).

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
from typing import ClassVar

import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from lerobot_cli.policies.smolvla.attention import AttentionHeads, KeyValues, joint_layer

# The prefix cache: per layer (keys, values), each (B, heads, L, head_dim) as transformers' DynamicCache.
PrefixCache = list["KeyValues"]


def expert_intermediate_size(hidden: int, ffn_multiplier: int = 4, multiple_of: int = 256) -> int:
    """The expert's MLP width for its hidden size (LeRobot's ``get_intermediate_size``)."""
    hidden = int(2 * hidden / 3)
    hidden = int(ffn_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


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
