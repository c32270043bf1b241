"""Run examples/lerobot_act_fsdp.py in LeRobot 0.6.1's environment and check what it promises.

The example trains LeRobot's own ``ACTPolicy`` on ``LeRobotDataset`` with FSDP2 ×2 (gloo) through
lerobot-parallel, lerobot-trainloop and lerobot-ckpt. Checked here:

1. an uninterrupted 8-step run and a 4-step run resumed to 8 log the same losses, bit for bit
   (weights, optimizer, RNG, sampler and accumulation window restored);
2. LeRobot's ``ACTPolicy.from_pretrained`` loads the gathered ``pretrained_model/`` (strictly: every
   key, the saved values) and LeRobot's processors load beside it; the policy predicts an action.

The three libraries must be installed in that environment (tools/interop/ci.sh does it, with its torch
pinned). Usage: ``uv run python tools/interop/example_lerobot_interop.py --lerobot-python <env>/bin/python``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "lerobot_act_fsdp.py"

LEROBOT_LOAD = """
import sys, torch
from safetensors.torch import load_file
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
from lerobot.datasets.lerobot_dataset import LeRobotDataset
pretrained, root = sys.argv[1], sys.argv[2]
policy = ACTPolicy.from_pretrained(pretrained).eval()
saved = load_file(pretrained + "/model.safetensors")
state = policy.state_dict()
assert set(saved) == set(state), sorted(set(saved) ^ set(state))[:5]
assert all(torch.equal(saved[k], state[k].cpu()) for k in saved), "a loaded tensor differs from the file"
pre, post = make_pre_post_processors(policy.config, pretrained_path=pretrained)
item = LeRobotDataset("lerobot/demo_reach", root=root, video_backend="pyav")[0]
batch = pre({k: v for k, v in item.items() if k.startswith("observation.") or k == "task"})
action = post(policy.select_action(batch))
assert action.shape[-1] == 2 and torch.isfinite(action).all(), action
print(f"LEROBOT_LOADED keys={len(saved)} action={action.flatten().tolist()}")
"""


def torchrun(lerobot_python: Path, out: Path, steps: int) -> None:
    cmd = [
        str(lerobot_python.parent / "torchrun"),
        "--nproc-per-node=2",
        str(EXAMPLE),
        f"--output_dir={out}",
        f"--steps={steps}",
    ]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0 or f"trained to step {steps}" not in res.stdout:
        sys.exit(
            f"example: FAILED: {' '.join(cmd)} (rc {res.returncode})\n{res.stdout[-3000:]}\n"
            f"{res.stderr[-3000:]}"
        )


def losses(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lerobot-python", type=Path, required=True)
    lerobot_python = parser.parse_args().lerobot_python
    with tempfile.TemporaryDirectory() as tmp:
        whole, resumed = Path(tmp) / "whole", Path(tmp) / "resumed"
        torchrun(lerobot_python, whole, 8)
        torchrun(lerobot_python, resumed, 4)
        torchrun(lerobot_python, resumed, 8)
        a, b = losses(whole), losses(resumed)
        if [r["step"] for r in a] != list(range(1, 9)) or a != b:
            sys.exit(
                f"example: FAILED: the resumed run's losses differ from the uninterrupted run's:\n{a}\n{b}"
            )
        print(
            f"example: resume bitwise: steps 5-8 losses {[r['loss'] for r in b[4:]]} equal the "
            "uninterrupted run's"
        )
        pretrained = whole / "checkpoints" / "000008" / "pretrained_model"
        res = subprocess.run(
            [
                str(lerobot_python),
                "-c",
                LEROBOT_LOAD,
                str(pretrained),
                str(REPO / "data" / "lerobot" / "demo_reach"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if res.returncode != 0 or "LEROBOT_LOADED" not in res.stdout:
            sys.exit(
                f"example: FAILED: LeRobot could not load {pretrained}:\n{res.stdout[-2000:]}\n"
                f"{res.stderr[-3000:]}"
            )
        print(f"example: {res.stdout.strip().splitlines()[-1]}")
    print("example: PASS")


if __name__ == "__main__":
    main()
