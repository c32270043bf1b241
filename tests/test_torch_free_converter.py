"""``pip install lerobot-ckpt`` is the standalone converter: no torch, and no numpy unless ``--dtype`` asks.

A fresh environment is built from the workspace's ``lerobot-ckpt`` alone (``uv sync --package
lerobot-ckpt``: the lock's versions, from uv's cache, offline, not editable), so it holds exactly what
the package declares. Real ``lerobot-train`` FSDP2 ×2 checkpoints (plain weights with an EMA, and a
PEFT adapter) are converted there and, from copies, by the workspace; the files must be equal byte
for byte, with and without ``--dtype=bfloat16`` (whose bytes must also equal torch's own cast of the
fp32 weights). ``--push_to_hub`` runs the real huggingface_hub code with its transport recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
FAKE_HUB_DIR = Path(__file__).resolve().parent / "fake_hub"
RUN = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--batch_size=4",
    "--log_freq=1",
    "--parallelism.dp_shard=2",
    "--steps=2",
    "--save_freq=2",
]
MLP = ["--policy.type=mlp", "--policy.hidden_dim=32"]

pytestmark = pytest.mark.slow


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is needed to build the torch-free environment (the README's prerequisites install it)"
    return uv


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh environment holding lerobot-ckpt and its declared dependencies, nothing else."""
    root = tmp_path_factory.mktemp("torch_free") / "venv"
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(root)}
    env.pop("VIRTUAL_ENV", None)
    # --reinstall-package: build the package from its sources now (uv would reuse a wheel it built earlier
    # from older sources, since its cache key is the project's metadata, not every file)
    res = subprocess.run(
        [
            _uv(),
            "sync",
            "--frozen",
            "--offline",
            "--no-dev",
            "--no-editable",
            "--quiet",
            "--package",
            "lerobot-ckpt",
            "--reinstall-package",
            "lerobot-ckpt",
            "--python",
            sys.executable,
        ],
        cwd=REPO,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return root


def _python(venv: Path, code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=venv.parent,
    )


@pytest.fixture(scope="module")
def steps(tmp_path_factory, launch) -> dict[str, Path]:
    """The step directories of an FSDP2 ×2 run with an EMA and of a PEFT run on its weights (DCP)."""
    root = tmp_path_factory.mktemp("torch_free_runs")
    base, peft = root / "base", root / "peft"
    launch.lerobot_train_runs(
        [*RUN, *MLP, "--ema.enable=true", "--checkpoint_format=safetensors_dcp", f"--output_dir={base}"],
        [
            *RUN,
            f"--policy.path={base}/checkpoints/000002/pretrained_model",
            "--peft.r=4",
            "--checkpoint_format=dcp",
            f"--output_dir={peft}",
        ],
        nproc=2,
    )
    return {"ema": base / "checkpoints" / "000002", "peft": peft / "checkpoints" / "000002"}


def test_the_environment_has_no_torch_and_a_library_import_names_the_extra(venv):
    assert (venv / "bin" / "lerobot-convert-dcp").is_file()
    res = _python(venv, "import torch")
    assert res.returncode != 0 and "No module named 'torch'" in res.stderr
    res = _python(venv, "import lerobot_ckpt; lerobot_ckpt.save_checkpoint")
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1] == (
        "ImportError: lerobot_ckpt.save_checkpoint needs torch, which is not installed: pip install "
        "'lerobot-ckpt[torch]' (lerobot-convert-dcp alone runs without it)"
    ), res.stderr


def _copy(step: Path, where: Path) -> Path:
    shutil.copytree(step, where)
    for done in where.rglob("*.safetensors"):  # safetensors_dcp wrote both: convert from the shards alone
        if done.parent.name in ("pretrained_model", "pretrained_model_ema"):
            done.unlink()
    return where


CONVERT_AND_REPORT = """
import json, sys
from lerobot_ckpt.convert.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "numpy": "numpy" in sys.modules}))
"""


@pytest.mark.parametrize("kind", ["ema", "peft"])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_conversion_without_torch_equals_the_workspace_conversion_bitwise(venv, steps, tmp_path, kind, dtype):
    from lerobot_ckpt import convert_dcp

    ours, theirs = _copy(steps[kind], tmp_path / "torch_free"), _copy(steps[kind], tmp_path / "workspace")
    flags = [f"--checkpoint_dir={ours}"] + ([f"--dtype={dtype}"] if dtype else [])
    res = subprocess.run(
        [str(venv / "bin" / "python"), "-c", CONVERT_AND_REPORT, *flags],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "torch": False, "numpy": dtype is not None}, res.stdout + res.stderr
    convert_dcp(theirs, dtype=dtype)
    names = ["adapter_model.safetensors"] if kind == "peft" else ["model.safetensors"]
    dirs = ["pretrained_model"] + (["pretrained_model_ema"] if kind == "ema" else [])
    for d in dirs:
        for name in names:
            assert (ours / d / name).read_bytes() == (theirs / d / name).read_bytes(), f"{kind} {d}/{name}"


def test_the_torch_free_cast_equals_torchs_cast(venv, steps, tmp_path):
    """The bfloat16 file's tensors are torch's ``.to(torch.bfloat16)`` of the fp32 ones, bit for bit."""
    import torch
    from safetensors.torch import load_file

    fp32, bf16 = _copy(steps["ema"], tmp_path / "fp32"), _copy(steps["ema"], tmp_path / "bf16")
    for step, extra in ((fp32, []), (bf16, ["--dtype=bfloat16"])):
        res = subprocess.run(
            [str(venv / "bin" / "lerobot-convert-dcp"), f"--checkpoint_dir={step}", *extra],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
    full, cast = (load_file(str(s / "pretrained_model" / "model.safetensors")) for s in (fp32, bf16))
    assert full.keys() == cast.keys() and any(t.dtype == torch.float32 for t in full.values())
    for key, tensor in full.items():
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        bits = torch.int16 if expected.dtype == torch.bfloat16 else expected.dtype  # equal bits, NaNs too
        assert cast[key].dtype == expected.dtype, key
        assert torch.equal(cast[key].view(bits), expected.view(bits)), key


def test_push_to_hub_without_torch(venv, steps, tmp_path):
    step = _copy(steps["ema"], tmp_path / "push")
    log = tmp_path / "hub.jsonl"
    res = subprocess.run(
        [str(venv / "bin" / "lerobot-convert-dcp"), f"--checkpoint_dir={step}", "--push_to_hub=me/converted"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(FAKE_HUB_DIR), "FAKE_HUB_LOG": str(log)},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "uploaded" in res.stdout and "me/converted" in res.stdout
    commits = [c for c in map(json.loads, log.read_text().splitlines()) if c["call"] == "create_commit"]
    assert commits and commits[0]["repo_id"] == "me/converted"
    assert "model.safetensors" in commits[0]["files"] and "config.json" in commits[0]["files"]
