"""A tiny PaliGemma-like tokenizer the tests build themselves (no network, no download, ids < 300).

Byte-level: every UTF-8 byte is one token, so any task text (the demo dataset's, pi05's "State: 12 255;"
prompts, newlines) tokenizes without unknown tokens. The special tokens sit where Gemma's do
(``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3) and ``<bos>`` is prepended, as PaliGemma's tokenizer
does. Saved with ``save_pretrained``, so ``AutoTokenizer.from_pretrained(directory)`` loads it in our
environment and in LeRobot's.

Use it from pytest through the ``tiny_tokenizer_dir`` fixture (packages/lerobot-cli/tests/conftest.py),
from anywhere else by loading this file by path (the tests are not a package), or as a script::

    uv run python packages/lerobot-cli/tests/vla_tokenizer.py OUTPUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")  # ids 0..3, Gemma's layout
PAD_ID, EOS_ID, BOS_ID, UNK_ID = range(4)
VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


def build_tiny_tokenizer():
    """The tokenizer as a ``transformers`` fast tokenizer object (not saved)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one symbol per byte value
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def save_tiny_tokenizer(directory: str | Path) -> Path:
    """Write the tokenizer into ``directory`` (tokenizer.json + tokenizer_config.json); returns it."""
    directory = Path(directory)
    build_tiny_tokenizer().save_pretrained(str(directory))
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    print(save_tiny_tokenizer(sys.argv[1]))
