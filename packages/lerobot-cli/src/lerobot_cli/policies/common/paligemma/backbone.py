"""PaliGemma (SigLIP + Gemma language model) with the Gemma action expert, built from ``transformers``.

The towers are transformers' own classes, constructed from config (no weights are fetched):
``PaliGemmaForConditionalGeneration`` for the vision tower, projector and language model, and
``GemmaForCausalLM`` for the expert. Their decoder layers are replaced by :mod:`.gemma`'s joint layers;
the expert's token embedding is dropped (it only ever reads the suffix embeddings). The attribute tree
gives LeRobot 0.6.1's state-dict keys, ``lm_head``s included (present in LeRobot's files, never used).

transformers ≥ 5.6 flattened the SigLIP vision model (no ``vision_model.`` level); LeRobot's files (its
pinned transformers 5.5) have it. :class:`SiglipTower` restores that level in the module tree itself,
so every checkpoint format (safetensors, DCP shards, PEFT adapters, converted files) carries LeRobot's
names without a renaming step anywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import GemmaConfig, GemmaForCausalLM, PaliGemmaConfig, PaliGemmaForConditionalGeneration

from lerobot_cli.policies.common.paligemma.gemma import (
    ATTENTION_MASK_VALUE,
    AdaRMSNorm,
    ExpertLayer,
    KeyValues,
    PaliGemmaLayer,
)
from lerobot_cli.policies.common.paligemma.variants import PALIGEMMA_VOCAB_SIZE, GemmaVariant, VisionVariant

INIT_STD = 0.02  # Gemma's initializer_range, for the layers built here


class SiglipTower(nn.Module):
    """Holds a flat transformers SigLIP vision model under ``vision_model`` (LeRobot's key level)."""

    def __init__(self, vision_model: nn.Module) -> None:
        super().__init__()
        self.vision_model = vision_model

    def forward(self, pixel_values: Tensor, **kwargs):
        return self.vision_model(pixel_values, **kwargs)


class UnusedHead(nn.Linear):
    """A tower's ``lm_head``: in LeRobot's files, read by no computation (pi0 predicts actions, not tokens).

    Its own class so it can be its own FSDP unit: a unit that never runs forward is never all-gathered,
    so these 0.8 B values (full size) stay sharded instead of joining the root's gathered parameters."""

    def forward(self, x: Tensor) -> Tensor:
        raise RuntimeError("pi0 never runs a tower's lm_head; it is kept only for LeRobot's checkpoint keys")


def _text_config(variant: GemmaVariant, **extra) -> GemmaConfig:
    return GemmaConfig(
        hidden_size=variant.width,
        intermediate_size=variant.mlp_dim,
        num_attention_heads=variant.num_heads,
        num_key_value_heads=variant.num_kv_heads,
        head_dim=variant.head_dim,
        num_hidden_layers=variant.depth,
        vocab_size=PALIGEMMA_VOCAB_SIZE,
        hidden_activation="gelu_pytorch_tanh",
        hidden_act="gelu_pytorch_tanh",
        tie_word_embeddings=False,
        **extra,
    )


def paligemma_config(vlm: GemmaVariant, vision: VisionVariant, image_size: int) -> PaliGemmaConfig:
    """LeRobot's PaliGemma settings: its vocabulary, image token id and SigLIP sizes."""
    config = PaliGemmaConfig(
        text_config=_text_config(vlm).to_dict(),
        vision_config={
            "model_type": "siglip_vision_model",
            "hidden_size": vision.hidden_size,
            "num_hidden_layers": vision.depth,
            "num_attention_heads": vision.num_heads,
            "intermediate_size": vision.intermediate_size,
            "patch_size": vision.patch_size,
            "image_size": image_size,
            "projection_dim": vlm.width,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "vision_use_head": False,
        },
        image_token_index=PALIGEMMA_VOCAB_SIZE,
        projection_dim=vlm.width,
        hidden_size=vlm.width,
        tie_word_embeddings=False,
    )
    config.text_config.tie_word_embeddings = False
    return config


@torch.no_grad()
def _init_layer(layer: nn.Module) -> None:
    for module in layer.modules():
        if isinstance(module, nn.Linear) and module.weight.device.type != "meta":
            if getattr(module, "zero_init", False):
                continue  # AdaRMSNorm's modulation starts at zero: the identity norm
            module.weight.normal_(0.0, INIT_STD)
            if module.bias is not None:
                module.bias.zero_()


class PaliGemmaWithExpert(nn.Module):
    """The two towers and the three ways pi0 runs them (training, prefix for inference, denoise step)."""

    def __init__(
        self,
        vlm: GemmaVariant,
        expert: GemmaVariant,
        vision: VisionVariant,
        image_size: int,
        expert_cond_dim: int | None = None,
    ) -> None:
        super().__init__()
        pg_config = paligemma_config(vlm, vision, image_size)
        self.paligemma = PaliGemmaForConditionalGeneration(pg_config)
        tower = self.paligemma.model.vision_tower
        if not hasattr(tower, "vision_model"):
            self.paligemma.model.vision_tower = SiglipTower(tower)
        language = self.paligemma.model.language_model
        language.layers = nn.ModuleList(PaliGemmaLayer(pg_config.text_config) for _ in range(vlm.depth))

        expert_config = _text_config(expert)
        self.gemma_expert = GemmaForCausalLM(expert_config)
        self.gemma_expert.model.embed_tokens = None
        self.paligemma.lm_head = UnusedHead(vlm.width, PALIGEMMA_VOCAB_SIZE, bias=False)
        self.gemma_expert.lm_head = UnusedHead(expert.width, PALIGEMMA_VOCAB_SIZE, bias=False)
        self.gemma_expert.model.layers = nn.ModuleList(
            ExpertLayer(expert_config, cond_dim=expert_cond_dim) for _ in range(expert.depth)
        )
        if expert_cond_dim is not None:
            self.gemma_expert.model.norm = AdaRMSNorm(
                expert.width, expert_config.rms_norm_eps, expert_cond_dim
            )
        for layer in (*language.layers, *self.gemma_expert.model.layers):
            _init_layer(layer)
        if self.paligemma.lm_head.weight is language.embed_tokens.weight:
            raise AssertionError(
                "PaliGemma's lm_head must not be tied to its embedding (LeRobot's files hold both)"
            )

    def unread_modules(self) -> list[nn.Module]:
        """Modules whose output no computation reads: both ``lm_head``s, and the language model's final
        norm plus its last layer's output projection, post-attention norm and MLP (the prefix tokens'
        last hidden states are never used; only their keys and values are). They get no gradient in
        LeRobot either; frozen here, DDP need not look for unused parameters every step."""
        last = self.language_model.layers[-1]
        return [
            self.paligemma.lm_head,
            self.gemma_expert.lm_head,
            self.language_model.norm,
            last.self_attn.o_proj,
            last.post_attention_layernorm,
            last.mlp,
        ]

    # -- parts ------------------------------------------------------------------------------------
    @property
    def language_model(self) -> nn.Module:
        return self.paligemma.model.language_model

    @property
    def expert_model(self) -> nn.Module:
        return self.gemma_expert.model

    def embed_image(self, image: Tensor) -> Tensor:
        """SigLIP tokens projected to the language width; the vision path always runs in fp32 (as LeRobot)."""
        out_dtype = image.dtype
        features = self.paligemma.model.get_image_features(image.to(torch.float32)).pooler_output
        return features.to(out_dtype)

    def embed_language_tokens(self, tokens: Tensor) -> Tensor:
        """Gemma's scaled token embedding (× sqrt(width), inside transformers' embedding module)."""
        return self.language_model.embed_tokens(tokens)

    def rotary(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        reference = torch.empty(0, dtype=dtype, device=position_ids.device)
        return self.language_model.rotary_emb(reference, position_ids)

    # -- the three passes -------------------------------------------------------------------------
    def run(
        self,
        hiddens: list[Tensor | None],
        mask_2d: Tensor,
        position_ids: Tensor,
        conds: tuple[Tensor | None, Tensor | None] = (None, None),
        cache: list[KeyValues] | None = None,
    ) -> tuple[list[Tensor | None], list[KeyValues]]:
        """All layers over ``hiddens = [prefix | None, suffix | None]``, then each tower's final norm.

        ``mask_2d``: boolean ``(B, T_q, T_k)`` (True = may attend); ``cache``: the prefix's keys/values per
        layer when only the suffix runs. Returns the normalised outputs and this pass's keys/values.
        """
        dtype = next(h for h in hiddens if h is not None).dtype
        mask = torch.where(mask_2d[:, None], 0.0, ATTENTION_MASK_VALUE).to(dtype=torch.float32)
        rotary = self.rotary(position_ids, dtype)
        new_cache: list[KeyValues] = []
        for i, (vlm_layer, expert_layer) in enumerate(
            zip(self.language_model.layers, self.expert_model.layers, strict=True)
        ):
            cached = cache[i] if cache is not None else None
            # --policy.gradient_checkpointing (LeRobot's) is lerobot-parallel's activation checkpointing of
            # each joint layer pair, applied by the trainer to this very method (lerobot_parallel.regions).
            hiddens, kv = vlm_layer.joint(expert_layer, hiddens, rotary, mask, conds, cached)
            new_cache.append(kv)
        norms = (self.language_model.norm, self.expert_model.norm)
        outputs = [
            None if h is None else _norm(norm, h, cond)
            for norm, h, cond in zip(norms, hiddens, conds, strict=True)
        ]
        return outputs, new_cache


def _norm(norm: nn.Module, h: Tensor, cond: Tensor | None) -> Tensor:
    """Final norm of a tower: transformers' GemmaRMSNorm (one output) or our adaptive one (pi05)."""
    out = norm(h, cond) if cond is not None else norm(h)
    return out[0] if isinstance(out, tuple) else out
