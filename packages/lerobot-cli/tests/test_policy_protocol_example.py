"""The README's example policy, registered in-process and trained by ``lerobot-train``'s own main()."""

import json
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
DEMO = Path(__file__).resolve().parents[3] / "data" / "lerobot" / "demo_reach"


def test_readme_example_policy_trains(tmp_path):
    block = re.search(r"<!-- example-policy -->\s*```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert block, "the README lost its example policy"
    assert len(block.group(1).strip().splitlines()) <= 32
    (tmp_path / "my_policies.py").write_text(block.group(1))
    out = tmp_path / "run"
    code = (
        "import my_policies\n"
        "from lerobot_cli.train import main\n"
        f"raise SystemExit(main(['--policy.type=linear', '--dataset.repo_id=lerobot/demo_reach',"
        f" '--dataset.root={DEMO}', '--num_workers=0', '--steps=30', '--log_freq=10', '--optimizer.lr=0.05',"
        f" '--output_dir={out}']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, check=False, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    config = json.loads((out / "checkpoints/last/pretrained_model/config.json").read_text())
    assert config["type"] == "linear"
