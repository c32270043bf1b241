"""A tiny SmolVLM the tests build themselves (no network, no download): a ``config.json`` of
transformers' ``SmolVLMConfig`` at test size and the byte-level tokenizer of vla_tokenizer.py, in one
directory that ``--policy.vlm_model_name`` names (SmolVLA reads the VLM's config and its tokenizer from it).

Sizes: a 2-layer vision tower of width 32 on 32×32 images in 8×8 patches (16 patches, pixel-shuffled by 2 into
4 tokens per camera), a 4-layer Llama text model of width 64 (4 heads, 2 key/value heads of 16), 300 tokens.

    uv run python packages/lerobot-cli/tests/smolvlm_tiny.py OUTPUT_DIR
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("vla_tokenizer", Path(__file__).with_name("vla_tokenizer.py"))
vla_tokenizer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vla_tokenizer)

IMAGE_SIZE = 32
TINY_SMOLVLM = {
    "model_type": "smolvlm",
    "architectures": ["SmolVLMForConditionalGeneration"],
    "scale_factor": 2,
    "image_token_id": 299,
    "vocab_size": 300,
    "tie_word_embeddings": False,
    "vision_config": {
        "model_type": "smolvlm_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": IMAGE_SIZE,
        "patch_size": 8,
    },
    "text_config": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 300,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
}


def save_tiny_smolvlm(directory: str | Path, text_dtype: str | None = None) -> Path:
    """Write config.json and the tiny tokenizer into ``directory``; returns it. ``text_dtype``: the text
    config's ``torch_dtype`` (SmolVLM2's real config says bfloat16, which builds the text model and the
    SmolVLA expert in bf16); None: unset (all fp32)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vla_tokenizer.save_tiny_tokenizer(directory)
    config = json.loads(json.dumps(TINY_SMOLVLM))
    if text_dtype is not None:
        config["text_config"]["torch_dtype"] = text_dtype
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    print(save_tiny_smolvlm(sys.argv[1]))
