"""The README's main command, run as written (with fewer steps), so the front page cannot rot.

The README's pi0 and SmolVLA demos are the guide's ``pi0-tiny`` and ``smolvla-tiny`` blocks, which
tests/test_guide_commands.py runs; here they are only checked to be those same commands.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _argv(body: str) -> list[str]:
    return shlex.split(body.replace("\\\n", " "))


def main_command() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- main-command -->\s*```bash\n(.*?)```", text, re.DOTALL)
    assert block, "README.md lost its <!-- main-command --> block"
    argv = _argv(block.group(1))
    assert argv[:3] == ["uv", "run", "lerobot-train"], argv
    return argv[2:]


@pytest.mark.parametrize(
    "readme_marker, guide_id", [("pi0-command", "pi0-tiny"), ("smolvla-command", "smolvla-tiny")]
)
def test_readme_policy_demo_is_the_guides_tested_one(readme_marker, guide_id):
    readme = re.search(
        rf"<!-- {readme_marker}\b[^>]*-->\s*```bash\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL
    )
    assert readme, f"README.md lost its <!-- {readme_marker} --> block"
    guide = re.search(
        rf"<!-- test: id={guide_id}\b[^>]*-->\s*```bash\n(.*?)```",
        (REPO / "docs" / "guide.md").read_text(),
        re.DOTALL,
    )
    assert guide, f"docs/guide.md lost its {guide_id} block"
    argv = _argv(readme.group(1))
    assert argv[:2] == ["uv", "run"], argv
    assert argv[2:] == _argv(guide.group(1))


@pytest.mark.slow
def test_readme_main_command_trains_and_the_loss_goes_down(tmp_path):
    argv = main_command()
    argv[0] = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
    out = tmp_path / "demo_act"
    argv += ["--steps=40", "--log_freq=10", f"--output_dir={out}"]  # later flags win
    proc = subprocess.run(argv, cwd=REPO, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Effective batch size: 8 x 1 dp workers x 1 grad accum = 8" in proc.stdout
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    assert (out / "checkpoints" / "last" / "pretrained_model" / "model.safetensors").is_file()
