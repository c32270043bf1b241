"""Write the demo VLM: a tiny SmolVLM (its ``config.json`` and the byte-level demo tokenizer) for the
guide's and the README's SmolVLA demo, which must run offline on a fresh machine.

SmolVLA reads two things from ``--policy.vlm_model_name``: the VLM's ``config.json`` (from which the
vision tower and the truncated language model are built) and its tokenizer (the pre-processor's). The real
one, ``HuggingFaceTB/SmolVLM2-500M-Video-Instruct``, is a Hub download of about 2 GB; this directory is the
test suite's tiny SmolVLM (``packages/lerobot-cli/tests/smolvlm_tiny.py``, loaded by path: the tests are
not a package): a 2-layer vision tower of width 32 on 32×32 images, a 4-layer text model of width 64,
and the 260-token byte tokenizer of ``data/tokenizers/demo_bytes``. It carries no weights (a fresh
SmolVLA starts from random ones, as LeRobot's does with ``load_vlm_weights=false``) and means nothing to
a model trained with SmolVLM2's vocabulary. The shipped copy is::

    uv run python tools/make_demo_vlm.py --output data/vlms/smolvlm_tiny --overwrite

The written files are byte-identical from run to run (``tests/test_demo_vlm.py`` checks the shipped copy
against a fresh build, so the two cannot drift apart); the script checks that transformers reads the
directory as a SmolVLM and that its tokenizer round-trips the demo task.
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
BUILDER = REPO / "packages" / "lerobot-cli" / "tests" / "smolvlm_tiny.py"
FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
MAX_BYTES = 64 * 1024  # per file: the demo VLM must stay small enough to live in git
DEMO_TASK = "Move the blue dot onto the red target."


def _builder():
    spec = importlib.util.spec_from_file_location("smolvlm_tiny", BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(directory: Path) -> dict[str, str]:
    """Save the tiny SmolVLM into ``directory``, keeping only FILES; returns their sha256 digests."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _builder().save_tiny_smolvlm(tmp)
        for name in FILES:
            shutil.copyfile(Path(tmp) / name, directory / name)
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in FILES}


def check(directory: Path, digests: dict[str, str]) -> None:
    from transformers import AutoConfig, AutoTokenizer, SmolVLMConfig

    for name in FILES:
        size = (directory / name).stat().st_size
        assert size <= MAX_BYTES, f"{directory / name}: {size} bytes, more than {MAX_BYTES}"
    with tempfile.TemporaryDirectory() as tmp:  # a second build must write the same bytes
        again = write(Path(tmp))
    assert again == digests, f"the demo VLM is not deterministic: {digests} != {again}"
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    assert isinstance(config, SmolVLMConfig), type(config)
    tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    ids = tok(DEMO_TASK)["input_ids"]
    assert max(ids) < config.text_config.vocab_size, ids
    assert tok.decode(ids, skip_special_tokens=True) == DEMO_TASK


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, default=REPO / "data" / "vlms" / "smolvlm_tiny")
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
