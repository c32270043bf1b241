"""FastWAM's text context: the task prompt through the frozen UMT5 encoder, as LeRobot 0.6.1 builds it.

A task ``t`` becomes the prompt ``prompt_template.format(task=t)`` (a batch's own ``prompt`` wins). The
UMT5 tokenizer pads every prompt to ``max_length`` (FastWAM's ``tokenizer_max_len``; its ``context_len``
field is read by nothing in LeRobot) with truncation and the tokenizer's special tokens (UMT5's ``</s>``),
using the tokenizer's own padding side. transformers' ``UMT5EncoderModel`` encodes it with that
attention mask; then, as Wan2.2 does, every position past the prompt's length (the mask's count of ones)
is zeroed and the mask becomes all ones: the DiT cross-attends to a fixed-length context whose padding is
zero vectors. The context comes out in the encoder's dtype (the model's ``torch_dtype``).

Attention is transformers' ``eager`` implementation, which LeRobot's transformers (5.5) picks for UMT5;
ours (5.24) would pick SDPA, whose other summation order moved the tiny encoder's context by 1e-6 in fp32
and 4e-2 in bf16 (measured against LeRobot in tools/interop/fastwam_processor_lerobot_interop.py; with
eager both sides are equal bit for bit). The encoder runs once per prompt batch, so the speed is moot.

The encoder is frozen (``requires_grad`` False, always eval: UMT5's dropout never runs) and held outside
the policy's registered modules (see ``frozen.py``). At full size it is UMT5-XXL's 5.68 B parameters,
11.4 GB in bf16 on every rank that encodes prompts, which is why ``contexts.py`` can compute each task's
context once instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lerobot_cli.custom_code import refuse_custom_code

# google/umt5-xxl's encoder, as Wan-AI/Wan2.2-TI2V-5B-Diffusers' text_encoder/config.json has it
UMT5_XXL_CONFIG: dict[str, Any] = {
    "vocab_size": 256384,
    "d_model": 4096,
    "d_kv": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "num_heads": 64,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "layer_norm_epsilon": 1e-6,
    "dropout_rate": 0.1,
    "tie_word_embeddings": False,
}
ATTENTION = "eager"  # LeRobot's UMT5 attention (see the module docstring)
PROMPT_TEMPLATE = "A video recorded from a robot's point of view executing the following instruction: {task}"


def tiny_umt5_config(d_model: int = 32, vocab_size: int = 384) -> dict[str, Any]:
    """A UMT5 encoder small enough for CPU tests: ``d_model`` is the context width the DiT's ``text_dim``
    must match; ``vocab_size`` must cover the tokenizer's ids (the tests' byte-level one has 259)."""
    return {
        **UMT5_XXL_CONFIG,
        "vocab_size": vocab_size,
        "d_model": d_model,
        "d_kv": 8,
        "d_ff": 2 * d_model,
        "num_layers": 2,
        "num_heads": 4,
    }


def _frozen(encoder: torch.nn.Module) -> torch.nn.Module:
    encoder.requires_grad_(False)
    encoder.eval()
    return encoder


def build_umt5_encoder(
    config: Mapping[str, Any], *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> torch.nn.Module:
    """A ``UMT5EncoderModel`` built from ``config`` with transformers' random initialisation (the global
    torch RNG: seed it first). Tests and CPU demos only: the real encoder is always loaded."""
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(**dict(config), attn_implementation=ATTENTION)
    return _frozen(UMT5EncoderModel(config).to(device=device, dtype=dtype))


def load_umt5_encoder(
    folder: str | Path, *, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> torch.nn.Module:
    """The pretrained encoder from a resolved local folder (``sources.resolve_part(..., TEXT_ENCODER)``)."""
    from transformers import UMT5EncoderModel

    encoder = UMT5EncoderModel.from_pretrained(
        str(folder), dtype=dtype, local_files_only=True, attn_implementation=ATTENTION
    )
    return _frozen(encoder.to(device=device, dtype=dtype))


def load_umt5_tokenizer(folder: str | Path) -> Any:
    """The tokenizer from a resolved local folder; one naming its own Python code is refused, never run."""
    refuse_custom_code(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)


def umt5_parameter_count(config: Mapping[str, Any] = UMT5_XXL_CONFIG) -> int:
    """Parameters of the encoder ``config`` describes, counted on the meta device (nothing allocated)."""
    from transformers import UMT5Config, UMT5EncoderModel

    with torch.device("meta"):
        encoder = UMT5EncoderModel(UMT5Config(**dict(config)))
    return sum(p.numel() for p in encoder.parameters())


def batch_prompts(batch: Mapping[str, Any], template: str = PROMPT_TEMPLATE) -> str | list[str] | None:
    """The prompt(s) of a batch: its ``prompt`` as given, else each ``task`` put into ``template``; None
    when it has neither (LeRobot's ``_prompt_from_batch``)."""
    prompt = batch.get("prompt")
    if prompt is not None:
        return prompt
    task = batch.get("task")
    if task is None:
        return None
    if isinstance(task, (list, tuple)):
        return [template.format(task=str(item)) for item in task]
    return template.format(task=str(task))


class PromptEncoder:
    """Tokenizer + frozen UMT5 encoder → FastWAM's ``(context [B, L, D], context_mask [B, L])``."""

    def __init__(self, tokenizer: Any, encoder: torch.nn.Module, max_length: int) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"tokenizer_max_len must be an integer >= 1, got {max_length!r}")
        self.tokenizer = tokenizer
        self.encoder = _frozen(encoder)
        self.max_length = max_length

    @property
    def dim(self) -> int:
        return int(self.encoder.config.d_model)

    def tokenize(self, prompts: str | Sequence[str]) -> tuple[Tensor, Tensor]:
        """``(input_ids, attention_mask)``, each ``[B, max_length]``, as the tokenizer returns them."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        out = self.tokenizer(
            prompts,
            padding="max_length",
            truncation=True,
            max_length=self.max_length,
            add_special_tokens=True,
            return_tensors="pt",
        )
        return out.input_ids, out.attention_mask

    @torch.no_grad()
    def encode(self, prompts: str | Sequence[str]) -> tuple[Tensor, Tensor]:
        """The context (encoder dtype, padding positions zero) and its all-true bool mask, on the encoder's
        device."""
        ids, mask = self.tokenize(prompts)
        device = next(self.encoder.parameters()).device
        ids = ids.to(device)
        mask = mask.to(device, dtype=torch.bool)
        context = self.encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        # positions from each prompt's length on (the count of its mask's ones, whatever the padding side)
        # are zeroed on the device: no readback of the lengths, so no host sync per prompt batch
        length = mask.sum(dim=1, keepdim=True)
        past = torch.arange(mask.shape[1], device=device).unsqueeze(0) >= length
        context = context.masked_fill(past.unsqueeze(-1), 0)
        return context, torch.ones_like(mask)
