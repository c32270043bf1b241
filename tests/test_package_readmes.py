"""The package READMEs: each states its purpose, lists its public API and shows a runnable example for
use from another trainer, and every ```python block in them is accounted for: run here, run by the
named test, or declared a signature listing / fragment. A new python block that nobody runs fails
``test_every_python_block_is_accounted_for`` until it is added to ``BLOCKS`` below."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("lerobot-parallel", "lerobot-ckpt", "lerobot-trainloop", "lerobot-cli")
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

# (package, first 40 characters of the block's first non-empty line) -> how it is checked.
#   ("run", marker printed on success)  executed below, as written, in a scratch directory
#   ("test", path)                     executed by that test file (which must read the README)
#   ("listing", why)                   not a program: signatures or a fragment of one
BLOCKS = {
    ("lerobot-parallel", "# torch-free"): ("listing", "public API signatures"),
    ("lerobot-parallel", "import torch"): ("test", "tests/multiproc/accelerate_child.py"),  # DDP example
    ("lerobot-parallel", "import torch#2"): ("test", "tests/multiproc/fsdp_checks.py"),  # FSDP2 example
    ("lerobot-ckpt", "import torch"): ("test", "packages/lerobot-ckpt/tests/test_ckpt_readme.py"),
    ("lerobot-ckpt", "save_checkpoint(output_dir, step, *, run"): ("listing", "public API signatures"),
    ("lerobot-ckpt", "run = RunInfo("): (
        "listing",
        "fragment: the sharded call pattern (run for real by tests/multiproc/ckpt_sharded.py)",
    ),
    ("lerobot-ckpt", "saver = AsyncCheckpointer.create(timeout"): (
        "listing",
        (
            "fragment: the asynchronous call pattern (run for real by "
            "packages/lerobot-ckpt/tests/test_ckpt_async.py)"
        ),
    ),
    ("lerobot-trainloop", "ShardedBatchSampler(num_samples, batch_s"): ("listing", "public API signatures"),
    ("lerobot-trainloop", "import torch"): ("test", "tests/multiproc/accelerate_child.py"),
    ("lerobot-cli", "from lerobot_cli.config import TrainConf"): (
        "listing",
        "public API imports and signatures",
    ),
    ("lerobot-cli", "import tempfile"): ("run", "ParallelismConfig(dp_replicate=1, dp_shard=4)"),
    ("lerobot-cli", "from typing import ClassVar"): (
        "test",
        "packages/lerobot-cli/tests/test_policy_protocol_example.py",
    ),
    ("lerobot-cli", "import torch"): ("run", "CLI_EXAMPLE_DONE"),  # datasets + ACT + processors, foreign loop
}


def readme(package: str) -> str:
    return (REPO / "packages" / package / "README.md").read_text()


def python_blocks(package: str) -> dict[str, str]:
    """first 40 characters of the first line (``#2``, ``#3`` … appended for repeats) -> code."""
    out: dict[str, str] = {}
    for m in FENCE.finditer(readme(package)):
        code = m.group(1)
        first = next(ln for ln in code.splitlines() if ln.strip())[:40].rstrip()
        key, n = first, 1
        while key in out:
            n += 1
            key = f"{first}#{n}"
        out[key] = code
    return out


def test_every_python_block_is_accounted_for():
    found = {(pkg, key) for pkg in PACKAGES for key in python_blocks(pkg)}
    assert found - set(BLOCKS) == set(), "python blocks nobody runs: add them to BLOCKS (and run them)"
    assert set(BLOCKS) - found == set(), "BLOCKS names blocks the READMEs no longer have"
    for how, what in BLOCKS.values():
        if how == "test":
            assert (REPO / what).is_file(), what
            assert "README.md" in (REPO / what).read_text(), f"{what} does not read a README"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_readme_has_purpose_api_and_a_foreign_trainer_example(package):
    text = readme(package)
    intro = text.split("\n## ", 1)[0]
    assert len(intro.split()) >= 30, f"{package}: the README should open with what the package is for"
    assert re.search(r"^## (Public )?API$", text, re.MULTILINE), f"{package}: no public API section"
    runnable = [key for (pkg, key), (how, _) in BLOCKS.items() if pkg == package and how in ("run", "test")]
    assert runnable, f"{package}: no runnable example"
    assert re.search(r"^## (Example|A foreign trainer)", text, re.MULTILINE), f"{package}: no example section"


@pytest.mark.slow
@pytest.mark.parametrize(
    "key", [k for k, (how, _) in BLOCKS.items() if how == "run"], ids=lambda k: f"{k[0]}:{k[1][:16]}"
)
def test_readme_example_runs_as_written(key, tmp_path, request):
    package, first = key
    code = python_blocks(package)[first]
    marker = BLOCKS[key][1]
    (tmp_path / "data").symlink_to(REPO / "data")  # examples address the bundled dataset as data/...
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.run(
        [sys.executable, "example.py"],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(request),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert marker in proc.stdout, proc.stdout[-2000:]
    if marker == "CLI_EXAMPLE_DONE":
        out = tmp_path / "outputs" / "my_act" / "pretrained_model"
        assert sorted(p.name for p in out.iterdir()) == [
            "config.json",
            "model.safetensors",
            "policy_postprocessor.json",
            "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
            "policy_preprocessor.json",
            "policy_preprocessor_step_3_normalizer_processor.safetensors",
        ]
        assert "action=(1, 2)" in proc.stdout  # one unnormalized 2-D action for one observation


def _env(request) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    # bytecode cached across runs (the same cache as tests/test_guide_commands.py), even where
    # PYTHONDONTWRITEBYTECODE is set: compiling torch's modules again costs more than the example
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="",
        PYTHONPYCACHEPREFIX=str(request.config.cache.mkdir("guide-pycache")),
    )
    return env
