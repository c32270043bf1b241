"""The README's foreign-trainer example runs as written, twice (the second run resumes), with every
sibling package and accelerate unimportable, i.e. as if lerobot-ckpt were installed alone."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

HARNESS = r"""
import importlib.abc, sys
BLOCKED = {"lerobot_cli", "lerobot_parallel", "lerobot_trainloop", "accelerate"}

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: lerobot-ckpt must work installed alone")
        return None

sys.meta_path.insert(0, Block())
import lerobot_ckpt
print("torch-free import:", "torch" not in sys.modules)
import importlib, pkgutil  # noqa: E401
# every module, torch-using ones too
for info in pkgutil.walk_packages(lerobot_ckpt.__path__, "lerobot_ckpt."):
    importlib.import_module(info.name)
code = open(sys.argv[1]).read()
for _ in range(2):
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
"""


@pytest.mark.slow
def test_readme_example_trains_saves_and_resumes(tmp_path):
    text = README.read_text()
    example = re.search(r"## A foreign trainer in 20 lines\n\n```python\n(.*?)```", text, re.DOTALL).group(1)
    assert len(example.strip().splitlines()) <= 25
    (tmp_path / "example.py").write_text(example)
    proc = subprocess.run(
        [sys.executable, "-c", HARNESS, "example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines() == [
        "torch-free import: True",
        "trained steps 1..20, last = 000020",
        "trained steps 21..40, last = 000040",
    ]
    ckpts = tmp_path / "outputs" / "my_run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["000010", "000020", "000030", "000040", "last"]
