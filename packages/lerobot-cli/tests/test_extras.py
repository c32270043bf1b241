"""A run that needs a lerobot-cli extra which is not installed stops in one line naming the extra.

The missing package is simulated, not uninstalled: a ``sitecustomize.py`` on ``PYTHONPATH`` puts a finder
first on ``sys.meta_path`` that refuses the blocked module, so ``lerobot-train`` sees it exactly as it would
see an environment without it (``find_spec`` and ``import`` both fail)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
TRAIN = str(Path(sys.executable).parent / "lerobot-train")
DATA = ["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}", "--num_workers=0", "--steps=1"]

BLOCKER = '''import sys


class _Blocked:
    """Pretends {names} are not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
'''


def train_without(tmp_path: Path, blocked: set[str], *args: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(names=blocked))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [TRAIN, *DATA, f"--output_dir={tmp_path / 'run'}", *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("blocked", "flags", "line"),
    [
        (
            "transformers",
            ["--policy.type=pi0"],
            (
                "--policy.type=pi0 needs lerobot-cli[pi] (transformers is not installed): "
                "pip install 'lerobot-cli[pi]'"
            ),
        ),
        (
            "transformers",
            ["--policy.type=pi05"],
            (
                "--policy.type=pi05 needs lerobot-cli[pi] (transformers is not installed): "
                "pip install 'lerobot-cli[pi]'"
            ),
        ),
        # FastWAM brings two packages (the Wan2.2 VAE's diffusers, UMT5's transformers): either one missing
        # names the extra and that package
        (
            "diffusers",
            ["--policy.type=fastwam"],
            (
                "--policy.type=fastwam needs lerobot-cli[fastwam] (diffusers is not installed): "
                "pip install 'lerobot-cli[fastwam]'"
            ),
        ),
        (
            "transformers",
            ["--policy.type=fastwam"],
            (
                "--policy.type=fastwam needs lerobot-cli[fastwam] (transformers is not installed): "
                "pip install 'lerobot-cli[fastwam]'"
            ),
        ),
        (
            "peft",
            ["--policy.type=mlp", "--peft.r=4"],
            "--peft.* needs lerobot-cli[peft] (peft is not installed): pip install 'lerobot-cli[peft]'",
        ),
    ],
    ids=["pi0", "pi05", "fastwam-diffusers", "fastwam-transformers", "peft"],
)
def test_a_missing_extra_is_one_line_naming_it(tmp_path, blocked, flags, line):
    res = train_without(tmp_path, {blocked}, *flags)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and line in lines[0], res.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_a_saved_peft_adapter_as_policy_path_needs_the_peft_extra(tmp_path):
    """``--policy.path`` at a PEFT run's ``pretrained_model/`` (``adapter_config.json`` beside the config)
    loads through peft: without it the run stops before any work, naming the extra (the adapter here is a
    real one, trained on a real base, so nothing else stands in the way)."""
    base = tmp_path / "base"
    subprocess.run(
        [TRAIN, *DATA, "--policy.type=mlp", f"--output_dir={base}"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    adapter = tmp_path / "lora"
    subprocess.run(
        [
            TRAIN,
            *DATA,
            f"--policy.path={base}/checkpoints/last/pretrained_model",
            "--peft.r=4",
            f"--output_dir={adapter}",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    saved = (adapter / "checkpoints/last/pretrained_model").resolve()
    assert (saved / "adapter_config.json").is_file()

    res = train_without(tmp_path, {"peft"}, f"--policy.path={saved}")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr[-3000:]
    assert (
        f"--policy.path={saved} (a PEFT adapter) needs lerobot-cli[peft] (peft is not installed): "
        "pip install 'lerobot-cli[peft]'"
    ) in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


def test_a_run_that_needs_no_extra_trains_without_them(tmp_path):
    res = train_without(tmp_path, {"transformers", "diffusers", "peft", "trackio"}, "--policy.type=mlp")
    assert res.returncode == 0, res.stderr[-3000:]
