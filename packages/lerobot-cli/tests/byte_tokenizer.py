"""The byte-level tokenizer the tests build themselves (no network, no download): what vla_tokenizer.py
(PaliGemma-like) and umt5_tokenizer.py (UMT5-like) share.

Every UTF-8 byte is one token, after the special tokens (ids 0.. in the order given), so any text
tokenizes without unknown tokens. A tokenizer differs from the other only in its special tokens and in the
template that adds one of them to every text. Saved with ``save_pretrained``, so
``AutoTokenizer.from_pretrained(directory)`` loads it in our environment and in LeRobot's.

Not used on its own: the two files above load it by path (the tests are not a package).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def build_byte_tokenizer(
    special_tokens: tuple[str, ...], *, single: str, pair: str, added: str, **roles: str
):
    """A ``transformers`` fast tokenizer (not saved): ``special_tokens`` (ids 0..; ``<unk>`` among them),
    then one token per byte value; ``single``/``pair`` are the post-processing templates, which name the
    special token ``added``; ``roles`` are the tokenizer's ``bos_token=``/``eos_token=``/``pad_token=``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one symbol per byte value
    vocab = {token: i for i, token in enumerate([*special_tokens, *alphabet])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(added, special_tokens.index(added))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, **roles, unk_token="<unk>")


def save_tokenizer(tokenizer, directory: str | Path) -> Path:
    """Write ``tokenizer`` into ``directory`` (tokenizer.json + tokenizer_config.json); returns it."""
    directory = Path(directory)
    tokenizer.save_pretrained(str(directory))
    return directory


def main(save: Callable[[str], Path]) -> None:
    """The command line of a tokenizer file: ``python FILE OUTPUT_DIR`` saves it there."""
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    print(save(sys.argv[1]))
