"""Check that a PEFT (LoRA) checkpoint written by ``lerobot-train --peft.*`` loads in LeRobot itself.

LeRobot's ``make_policy`` treats ``--policy.path`` as an adapter when the directory's ``config.json``
says ``use_peft: true``: it reads ``adapter_config.json``, loads the base named in
``base_model_name_or_path`` with ``ACTPolicy.from_pretrained`` and applies the adapter with
``peft.PeftModel.from_pretrained``. This script runs that exact sequence in LeRobot's environment on
the ``pretrained_model/`` of a real LoRA run and compares the action chunk with ours.

    # /tmp/lerobot-venv: the LeRobot env of act_lerobot_interop.py
    uv pip install --python /tmp/lerobot-venv/bin/python 'peft==0.21.2'
    uv run python tools/interop/peft_lerobot_interop.py --lerobot-python /tmp/lerobot-venv/bin/python

Exit status 0 means LeRobot saw ``use_peft``, built a ``PeftModel`` and matched our actions.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
ATOL = 1e-5
SMALL = {
    "pretrained_backbone_weights": None,
    "dim_model": 32,
    "dim_feedforward": 64,
    "n_heads": 2,
    "n_encoder_layers": 1,
    "n_decoder_layers": 1,
    "chunk_size": 5,
    "n_action_steps": 5,
    "dropout": 0.0,
}


def ours_write(work: Path) -> Path:
    """A tiny ACT base, a 3-step LoRA run on it through ``lerobot-train``, and our reference actions."""
    import torch
    from lerobot_cli.datasets import load_meta
    from lerobot_cli.policies.act.config import ACTConfig
    from lerobot_cli.policies.act.modeling import ACTPolicy
    from lerobot_cli.policies.pretrained import load_pretrained, save_pretrained
    from lerobot_cli.workload import policy_config_for_dataset
    from safetensors.torch import save_file

    config = policy_config_for_dataset(ACTConfig(**SMALL), load_meta(DEMO).features)
    torch.manual_seed(0)
    base = save_pretrained(ACTPolicy(config), config, work / "base")
    run = work / "lora"
    subprocess.run(
        [
            str(Path(sys.executable).parent / "lerobot-train"),
            "--dataset.repo_id=lerobot/demo_reach",
            f"--dataset.root={DEMO}",
            f"--policy.path={base}",
            "--peft.r=4",
            '--peft.full_training_modules=["action_head"]',
            "--optimizer.lr=1e-2",
            "--steps=3",
            "--batch_size=4",
            "--num_workers=0",
            "--log_freq=0",
            f"--output_dir={run}",
        ],
        check=True,
    )
    adapter = run / "checkpoints" / "last" / "pretrained_model"
    _, model = load_pretrained(adapter)
    g = torch.Generator().manual_seed(3)
    batch = {
        k: torch.randn((2, *f.shape), generator=g)
        for k, f in model.get_base_model().config.input_features.items()
    }
    with torch.no_grad():
        actions = model.get_base_model().predict_action_chunk(batch)
    save_file({"actions": actions.contiguous(), **batch}, str(work / "reference.safetensors"))
    return adapter.resolve()


LEROBOT_SIDE = r"""
import sys, torch
from safetensors.torch import load_file
from peft import PeftConfig, PeftModel
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.act.modeling_act import ACTPolicy

adapter, reference = sys.argv[1], sys.argv[2]
cfg = PreTrainedConfig.from_pretrained(adapter)
assert cfg.use_peft, "config.json does not say use_peft: LeRobot's make_policy would load it as full weights"
peft_config = PeftConfig.from_pretrained(adapter)                 # make_policy's sequence, verbatim in effect
policy = ACTPolicy.from_pretrained(peft_config.base_model_name_or_path)
policy = PeftModel.from_pretrained(policy, adapter, config=peft_config, is_trainable=True)
assert type(policy).__name__ == "PeftModel"
ref = load_file(reference)
expected = ref.pop("actions")
policy.eval()
with torch.no_grad():
    got = policy.get_base_model().predict_action_chunk(ref)
diff = float((got - expected).abs().max())
print(f"LeRobot: use_peft={cfg.use_peft}, base={peft_config.base_model_name_or_path}, "
      f"max |Δaction| = {diff:.2e}")
sys.exit(0 if diff < float(sys.argv[3]) else 1)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--lerobot-python", required=True, help="python of an env with lerobot 0.6.x and peft"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        adapter = ours_write(work)
        proc = subprocess.run(
            [
                args.lerobot_python,
                "-c",
                LEROBOT_SIDE,
                str(adapter),
                str(work / "reference.safetensors"),
                str(ATOL),
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        print(proc.stdout.strip() or proc.stderr[-3000:])
        print("PASS" if proc.returncode == 0 else "FAIL")
        return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
