"""A tiny UMT5-like tokenizer the FastWAM tests build themselves (no network, no download, ids < 259).

Byte-level (every UTF-8 byte is one token, so any task text tokenizes), with T5's special tokens where
T5/UMT5 keep them (``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2) and ``</s>`` appended to every text, as UMT5's
tokenizer does. Saved with ``save_pretrained``, so ``AutoTokenizer.from_pretrained(directory)`` loads it
in our environment and in LeRobot's (where it stands in for ``google/umt5-xxl``).

From pytest: ``load_helper("umt5_tokenizer")`` (conftest.py); elsewhere load this file by path or run::

    uv run python packages/lerobot-cli/tests/umt5_tokenizer.py OUTPUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")  # ids 0..2, T5's layout
PAD_ID, EOS_ID, UNK_ID = range(3)
VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


def build_tiny_umt5_tokenizer():
    """The tokenizer as a ``transformers`` fast tokenizer object (not saved)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one symbol per byte value
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", EOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def save_tiny_umt5_tokenizer(directory: str | Path) -> Path:
    """Write the tokenizer into ``directory`` (tokenizer.json + tokenizer_config.json); returns it."""
    directory = Path(directory)
    build_tiny_umt5_tokenizer().save_pretrained(str(directory))
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    print(save_tiny_umt5_tokenizer(sys.argv[1]))
