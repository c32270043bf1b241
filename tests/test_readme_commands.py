"""The README's main command, run as written (with fewer steps), so the front page cannot rot."""

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


def main_command() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- main-command -->\s*```bash\n(.*?)```", text, re.S)
    assert block, "README.md lost its <!-- main-command --> block"
    argv = shlex.split(block.group(1).replace("\\\n", " "))
    assert argv[:3] == ["uv", "run", "lerobot-train"], argv
    return argv[2:]


@pytest.mark.slow
def test_readme_main_command_trains_and_the_loss_goes_down(tmp_path):
    argv = main_command()
    argv[0] = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
    out = tmp_path / "demo_act"
    argv += ["--steps=40", "--log_freq=10", f"--output_dir={out}"]  # later flags win
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Effective batch size: 8 x 1 dp workers x 1 grad accum = 8" in proc.stdout
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    assert (out / "checkpoints" / "last" / "pretrained_model" / "model.safetensors").is_file()
