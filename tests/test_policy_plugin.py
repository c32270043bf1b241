"""A policy from outside lerobot-cli is its own folder plus one entry point, and trains under FSDP2 x2
with the wrap units its spec names.

``tests/data/policy_plugin`` is that package (``tiny_resmlp/``: config and model; its ``pyproject.toml``
declares the entry point). It is made visible without installing anything (offline, and the workspace
venv stays as ``uv sync`` made it): its directory goes on ``PYTHONPATH`` and its entry point is written,
from its own ``pyproject.toml``, into a ``*.dist-info`` directory also on ``PYTHONPATH``, which is where
``importlib.metadata`` looks for installed distributions.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "data" / "policy_plugin"
DEMO = REPO / "data" / "lerobot" / "demo_reach"
DATA = ["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}", "--num_workers=0"]

pytestmark = pytest.mark.slow


def plugin_env(site: Path) -> dict[str, str]:
    """``PYTHONPATH`` holding the plugin's sources and a dist-info with its entry points."""
    meta = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    info = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n"
    )
    lines = [
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
        for group, points in meta["entry-points"].items()
    ]
    (info / "entry_points.txt").write_text("\n".join(lines))
    path = os.pathsep.join(filter(None, [str(site), str(PLUGIN), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path}


def test_an_entry_point_policy_trains_under_fsdp2_with_its_own_wrap_units(launch, tmp_path):
    env = plugin_env(tmp_path / "site")
    listed = launch.run_command([launch.LEROBOT_TRAIN, "--help"], timeout_s=120, env=env)
    assert "tiny_resmlp" in listed.stdout, listed.describe()

    out = tmp_path / "run"
    res = launch.lerobot_train(
        *DATA,
        "--policy.type=tiny_resmlp",
        "--policy.depth=3",
        "--parallelism.dp_shard=-1",
        "--batch_size=4",
        "--steps=6",
        "--log_freq=1",
        "--save_freq=6",
        f"--output_dir={out}",
        nproc=2,
        env=env,
    )
    assert "topology dp_replicate=1 x dp_shard=2 (FSDP2)" in res.stdout, res.describe()
    assert "Sharding plan: fsdp on mesh (dp_shard=2)" in res.stdout, res.describe()
    assert "(ResidualUnit)" in res.stdout and "TinyResMLPConfig.spec" not in res.stderr, res.describe()
    for i in range(3):
        assert f"units.{i}" in res.stdout, res.describe()
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    config = json.loads((out / "checkpoints/last/pretrained_model/config.json").read_text())
    assert config["type"] == "tiny_resmlp" and config["depth"] == 3
