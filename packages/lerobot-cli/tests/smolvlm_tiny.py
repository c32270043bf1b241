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


def save_tiny_smolvlm_weights(directory: str | Path, seed: int = 0, shards: int = 1) -> dict:
    """Write seeded fp32 weights of the tiny SmolVLM whose ``config.json`` is in ``directory`` (all its text
    layers: SmolVLA keeps ``num_vlm_layers`` of them): ``model.safetensors``, or with ``shards`` > 1 that
    many ``model-0000i-of-0000n.safetensors`` and the ``model.safetensors.index.json`` mapping each tensor
    to its shard, as ``save_pretrained`` splits a large model. Returns the tensors written."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, SmolVLMForConditionalGeneration

    directory = Path(directory)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmolVLMForConditionalGeneration(AutoConfig.from_pretrained(str(directory)))
        # the default init leaves norms at 1 and biases at 0: other values, so a skipped copy shows
        state = {k: (v + 0.01 * torch.randn_like(v)).contiguous() for k, v in model.state_dict().items()}
    if shards <= 1:
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return state
    keys = sorted(state)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i::shards]
        save_file({k: state[k] for k in part}, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    index = {"metadata": {"total_size": sum(v.numel() * 4 for v in state.values())}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return state


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    print(save_tiny_smolvlm(sys.argv[1]))
