"""Write the demo tokenizer: a byte-level stand-in for PaliGemma's, for tests and demos only.

pi0 and pi05 tokenize each frame's task string. PaliGemma's real tokenizer
(``google/paligemma-3b-pt-224``, 257,152 tokens, the one ``--policy.tokenizer_name`` names by default)
is a gated Hub download, so the README's and the guide's tiny pi0 demo uses this one instead and runs
offline on a fresh machine. It is **not** PaliGemma's vocabulary: every UTF-8 byte is one token (260 ids,
with ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3 where Gemma has them, ``<bos>`` prepended), so
any task text tokenizes and the ids fit every variant's 257,152-row embedding, but they mean nothing to
a model trained with the real tokenizer: pretrained checkpoints such as LeRobot's ``lerobot/pi0_base``
need ``google/paligemma-3b-pt-224``.

The tokenizer is the one the test suite builds (``packages/lerobot-cli/tests/vla_tokenizer.py``,
loaded by path: the tests are not a package). The shipped copy is::

    uv run python tools/make_demo_tokenizer.py --output data/tokenizers/demo_bytes --overwrite

and ``--policy.tokenizer_name=data/tokenizers/demo_bytes`` uses it. The written files (tokenizer.json,
tokenizer_config.json) are a few tens of kB and byte-identical from run to run; the script checks both
and that ``transformers.AutoTokenizer`` loads the directory and round-trips the demo task.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILDER = REPO / "packages" / "lerobot-cli" / "tests" / "vla_tokenizer.py"
FILES = ("tokenizer.json", "tokenizer_config.json")
MAX_BYTES = 64 * 1024  # per file: the stand-in must stay small enough to live in git
DEMO_TASK = "Move the blue dot onto the red target."


def _builder():
    spec = importlib.util.spec_from_file_location("vla_tokenizer", BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(directory: Path) -> dict[str, str]:
    """Save the tokenizer into ``directory`` and keep only FILES; returns their sha256 digests."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _builder().save_tiny_tokenizer(tmp)
        for name in FILES:
            shutil.copyfile(Path(tmp) / name, directory / name)
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in FILES}


def check(directory: Path, digests: dict[str, str]) -> None:
    from transformers import AutoTokenizer

    for name in FILES:
        size = (directory / name).stat().st_size
        assert size <= MAX_BYTES, f"{directory / name}: {size} bytes, more than {MAX_BYTES}"
    with tempfile.TemporaryDirectory() as tmp:  # a second build must write the same bytes
        again = write(Path(tmp))
    assert again == digests, f"the tokenizer is not deterministic: {digests} != {again}"
    tok = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    ids = tok(DEMO_TASK)["input_ids"]
    builder = _builder()
    assert ids[0] == builder.BOS_ID and len(ids) == 1 + len(DEMO_TASK.encode()), ids
    assert tok.decode(ids, skip_special_tokens=True) == DEMO_TASK
    assert (tok.pad_token_id, tok.eos_token_id, len(tok)) == (
        builder.PAD_ID,
        builder.EOS_ID,
        builder.VOCAB_SIZE,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, default=REPO / "data" / "tokenizers" / "demo_bytes")
    p.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    args = p.parse_args()
    if args.output.exists():
        if not args.overwrite:
            sys.exit(f"{args.output} exists (pass --overwrite to replace it)")
        shutil.rmtree(args.output)
    digests = write(args.output)
    check(args.output, digests)
    for name in FILES:
        print(
            f"{args.output / name}: {(args.output / name).stat().st_size:,} bytes, "
            f"sha256 {digests[name][:16]}"
        )


if __name__ == "__main__":
    main()
