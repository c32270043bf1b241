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

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "byte_tokenizer", Path(__file__).with_name("byte_tokenizer.py")
)
byte_tokenizer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(byte_tokenizer)

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")  # ids 0..3, Gemma's layout
PAD_ID, EOS_ID, BOS_ID, UNK_ID = range(4)
VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


def build_tiny_tokenizer():
    """The tokenizer as a ``transformers`` fast tokenizer object (not saved)."""
    return byte_tokenizer.build_byte_tokenizer(
        SPECIAL_TOKENS,
        single="<bos> $A",
        pair="<bos> $A $B",
        added="<bos>",
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
    )


def save_tiny_tokenizer(directory: str | Path) -> Path:
    """Write the tokenizer into ``directory`` (tokenizer.json + tokenizer_config.json); returns it."""
    return byte_tokenizer.save_tokenizer(build_tiny_tokenizer(), directory)


if __name__ == "__main__":
    byte_tokenizer.main(save_tiny_tokenizer)
