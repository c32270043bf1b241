"""A tiny UMT5-like tokenizer the FastWAM tests build themselves (no network, no download, ids < 259).

Byte-level (every UTF-8 byte is one token, so any task text tokenizes), with T5's special tokens where
T5/UMT5 keep them (``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2) and ``</s>`` appended to every text, as UMT5's
tokenizer does. Saved with ``save_pretrained``, so ``AutoTokenizer.from_pretrained(directory)`` loads it
in our environment and in LeRobot's (where it stands in for ``google/umt5-xxl``).

From pytest: ``load_helper("umt5_tokenizer")`` (conftest.py); elsewhere load this file by path or run::

    uv run python packages/lerobot-cli/tests/umt5_tokenizer.py OUTPUT_DIR
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "byte_tokenizer", Path(__file__).with_name("byte_tokenizer.py")
)
byte_tokenizer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(byte_tokenizer)

SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")  # ids 0..2, T5's layout
PAD_ID, EOS_ID, UNK_ID = range(3)
VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


def build_tiny_umt5_tokenizer():
    """The tokenizer as a ``transformers`` fast tokenizer object (not saved)."""
    return byte_tokenizer.build_byte_tokenizer(
        SPECIAL_TOKENS,
        single="$A </s>",
        pair="$A </s> $B </s>",
        added="</s>",
        eos_token="</s>",
        pad_token="<pad>",
    )


def save_tiny_umt5_tokenizer(directory: str | Path) -> Path:
    """Write the tokenizer into ``directory`` (tokenizer.json + tokenizer_config.json); returns it."""
    return byte_tokenizer.save_tokenizer(build_tiny_umt5_tokenizer(), directory)


if __name__ == "__main__":
    byte_tokenizer.main(save_tiny_umt5_tokenizer)
