"""The shipped demo VLM (``data/vlms/smolvlm_tiny``, the guide's and the README's SmolVLA demo) is what
``tools/make_demo_vlm.py`` builds from the test suite's tiny SmolVLM, byte for byte, and loads offline."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "vlms" / "smolvlm_tiny"


def _tool():
    spec = importlib.util.spec_from_file_location("make_demo_vlm", REPO / "tools" / "make_demo_vlm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_demo_vlm_is_the_tools_build(tmp_path):
    tool = _tool()
    digests = tool.write(tmp_path / "fresh")
    assert sorted(p.name for p in SHIPPED.iterdir()) == sorted(tool.FILES)
    for name in tool.FILES:
        assert (SHIPPED / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), (
            f"{SHIPPED / name} differs from tools/make_demo_vlm.py's build: rerun it with --overwrite"
        )
    tool.check(SHIPPED, digests)  # transformers reads a SmolVLM and a tokenizer that round-trips the task
