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
from lerobot_cli.extras import EXTRAS
from lerobot_cli.policies import registry

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


# The line, pinned; which policy needs which extra, and which modules each extra brings, are the registry's
# (each spec's ``extras``) and lerobot_cli.extras.EXTRAS': a new policy needing an extra is checked here too.
POLICY_LINE = (
    "--policy.type={policy} needs lerobot-cli[{extra}] ({module} is not installed): "
    "pip install 'lerobot-cli[{extra}]'"
)


def policy_extra_cases() -> list[tuple[str, str, str]]:
    """``(policy, extra, module)`` for every module of every extra each registered policy's spec names
    (FastWAM: diffusers and transformers, either one missing names the extra and that package)."""
    return [
        (name, extra, module)
        for name in registry.available()
        for extra in registry.config_class(name).spec.extras
        for module in EXTRAS[extra]
    ]


@pytest.mark.parametrize(
    ("policy", "extra", "module"), policy_extra_cases(), ids=lambda value: value.replace("lerobot-cli", "")
)
def test_a_missing_policy_extra_is_one_line_naming_it(tmp_path, policy, extra, module):
    res = train_without(tmp_path, {module}, f"--policy.type={policy}")
    line = POLICY_LINE.format(policy=policy, extra=extra, module=module)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and line in lines[0], res.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_the_derived_cases_hold_the_ones_pinned_before():
    """The registry still says what these tests once listed by hand (pi0/pi05: [pi], FastWAM: [fastwam])."""
    assert {
        ("pi0", "pi", "transformers"),
        ("pi05", "pi", "transformers"),
        ("fastwam", "fastwam", "diffusers"),
        ("fastwam", "fastwam", "transformers"),
    } <= set(policy_extra_cases())


@pytest.mark.parametrize(
    ("blocked", "flags", "line"),
    [
        (
            "peft",
            ["--policy.type=mlp", "--peft.r=4"],
            "--peft.* needs lerobot-cli[peft] (peft is not installed): pip install 'lerobot-cli[peft]'",
        ),
    ],
    ids=["peft"],
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
    assert registry.config_class("mlp").spec.extras == ()
    every_extra = {module for modules in EXTRAS.values() for module in modules}
    assert {"transformers", "diffusers", "peft", "trackio"} <= every_extra
    res = train_without(tmp_path, every_extra, "--policy.type=mlp")
    assert res.returncode == 0, res.stderr[-3000:]
