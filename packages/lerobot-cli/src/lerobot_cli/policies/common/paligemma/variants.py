"""Sizes of the two Gemma towers and the SigLIP vision tower (torch-free).

LeRobot's ``gemma_2b`` / ``gemma_300m`` (openpi's ``gemma.get_config``) and its SigLIP so400m tower are
kept exactly, so full-size checkpoints have LeRobot's shapes. ``gemma_tiny`` and the ``tiny`` vision tower
exist for tests and CPU demos only. Every Gemma variant keeps 8 query heads, one key/value head and the
257,152-token PaliGemma vocabulary: joint attention concatenates the two towers' heads, so the towers
must agree on the head layout, and LeRobot's own joint-attention code assumes 8 heads.
"""

from __future__ import annotations

from attrs import define

PALIGEMMA_VOCAB_SIZE = 257_152  # PaliGemma's tokenizer vocabulary (LeRobot fixes it for every variant)


@define(frozen=True)
class GemmaVariant:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@define(frozen=True)
class VisionVariant:
    hidden_size: int
    depth: int
    num_heads: int
    intermediate_size: int
    patch_size: int


GEMMA_VARIANTS: dict[str, GemmaVariant] = {
    "gemma_300m": GemmaVariant(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_2b": GemmaVariant(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_tiny": GemmaVariant(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=8),
}

# so400m is SigLIP's shape-optimised ViT as PaliGemma 3B-224 uses it (transformers' PaliGemmaConfig default
# vision tower, with LeRobot's intermediate_size 4304).
VISION_VARIANTS: dict[str, VisionVariant] = {
    "so400m": VisionVariant(hidden_size=1152, depth=27, num_heads=16, intermediate_size=4304, patch_size=14),
    "tiny": VisionVariant(hidden_size=32, depth=2, num_heads=2, intermediate_size=64, patch_size=14),
}

# What LeRobot 0.6.1 itself accepts: a config.json with other values is ours alone.
LEROBOT_GEMMA_VARIANTS = ("gemma_300m", "gemma_2b")
