"""``accelerate launch`` as a plain launcher, against the env guard.

Two layers: (1) accelerate's own env-building functions, called in-process with its own argument
parser, so the guard is checked against exactly what this accelerate version exports; (2) real
launches on CPU: how many processes each command starts, a 2-process ``--multi_gpu`` job that
passes the guard and runs both README examples, and a ``--use_fsdp`` job that is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from lerobot_parallel.env_guard import check_accelerate_env

CHILD = Path(__file__).resolve().parent / "multiproc" / "accelerate_child.py"
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # these are CPU facts: hide GPUs where CI has some


def _exported_by_accelerate(argv: list[str]) -> dict[str, str]:
    """Variables accelerate's launcher would add or change for ``accelerate launch <argv> s.py``."""
    # a free port: accelerate refuses a port in use, and other jobs may hold the default 29500
    import socket

    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    parsed = launch_command_parser().parse_args([*argv, f"--main_process_port={port}", "s.py"])
    args, _, _ = _validate_launch_command(parsed)
    if args.multi_gpu or args.use_fsdp:
        env = prepare_multi_gpu_env(args)
    else:
        _, env = prepare_simple_launcher_cmd_env(args)
    return {k: v for k, v in env.items() if os.environ.get(k) != v}


@pytest.fixture
def no_accelerate_config(tmp_path, monkeypatch):
    # a user's ~/.cache/huggingface/accelerate/default_config.yaml would change what launch exports
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    for k in list(os.environ):
        if k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")):
            monkeypatch.delenv(k)


@pytest.mark.parametrize(
    "argv",
    [
        ["--num_processes=2"],
        ["--cpu", "--num_processes=2"],
        ["--multi_gpu", "--num_processes=2"],
        ["--multi_gpu", "--num_processes=2", "--mixed_precision=no", "--dynamo_backend=no"],
    ],
)
def test_guard_passes_what_a_plain_launch_exports(argv, no_accelerate_config):
    exported = _exported_by_accelerate(argv)
    assert "ACCELERATE_MIXED_PRECISION" in exported  # we really looked at accelerate's output
    assert check_accelerate_env("no", exported).clean, exported


def test_guard_refuses_what_use_fsdp_exports(no_accelerate_config):
    exported = _exported_by_accelerate(["--use_fsdp", "--num_processes=2"])
    names = set(check_accelerate_env("no", exported).names)
    assert "ACCELERATE_USE_FSDP" in names and "FSDP_SHARDING_STRATEGY" in names
    assert names == {k for k in exported if k == "ACCELERATE_USE_FSDP" or k.startswith("FSDP_")}


def test_guard_refuses_mixed_precision_from_the_launcher(no_accelerate_config):
    exported = _exported_by_accelerate(["--num_processes=2", "--mixed_precision=bf16"])
    assert check_accelerate_env("no", exported).names == ("ACCELERATE_MIXED_PRECISION",)
    assert check_accelerate_env("bf16", exported).clean


def _children(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("env-*.json"))]


@pytest.mark.slow
def test_plain_launch_without_multi_gpu_starts_one_process(launch, tmp_path):
    job = launch.accelerate_launch(
        CHILD,
        str(tmp_path),
        "probe",
        launch_args=("--num_processes=2",),
        env={"HF_HOME": str(tmp_path), **NO_GPU},
        timeout_s=90,
    )
    assert job.returncode == 0, job.describe()
    children = _children(tmp_path)
    assert len(children) == 1, "accelerate launch --num_processes=2 without GPUs starts ONE process"
    env = children[0]
    assert "RANK" not in env and "WORLD_SIZE" not in env and env["MASTER_PORT"]
    assert env["ACCELERATE_MIXED_PRECISION"] == "no" and env["ACCELERATE_USE_CPU"] == "False"
    assert "GUARD_PASSED rank=none" in job.stdout


@pytest.mark.slow
def test_multi_gpu_launch_on_cpu_passes_the_guard_and_runs_the_readme_examples(launch, tmp_path):
    job = launch.accelerate_launch(
        CHILD,
        str(tmp_path),
        "examples",
        launch_args=("--multi_gpu", "--num_processes=2", f"--main_process_port={launch.free_port()}"),
        env={"ACCELERATE_USE_CPU": "true", "HF_HOME": str(tmp_path), **NO_GPU},
        cwd=tmp_path,
        timeout_s=150,
    )
    assert job.returncode == 0 and not job.timed_out, job.describe()
    children = _children(tmp_path)
    assert len(children) == 2 and sorted(c["RANK"] for c in children) == ["0", "1"]
    for env in children:
        assert env["WORLD_SIZE"] == "2" and env["ACCELERATE_USE_CPU"] == "true"
        assert env["ACCELERATE_MIXED_PRECISION"] == "no" and "ACCELERATE_DYNAMO_BACKEND" in env
    out = job.stdout
    assert "GUARD_PASSED rank=0" in out and "GUARD_PASSED rank=1" in out
    for pkg in ("lerobot-parallel", "lerobot-trainloop"):
        assert f"EXAMPLE_DONE {pkg} rank=0" in out and f"EXAMPLE_DONE {pkg} rank=1" in out
    assert "PARALLEL_EXAMPLE_DONE" in out
    assert "world 2 (ddp: dp_replicate=2 x dp_shard=1), backend gloo, device cpu" in out
    assert "Effective batch size: 8 x 2 dp workers x 2 grad accum = 32" in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("step ")] == [
        "10",
        "20",
        "30",
        "40",
    ]
    import torch

    state = torch.load(tmp_path / "state.pt")
    # 40 loop steps x 8 x 2 ranks = 640 samples = 2 epochs of 256 + 128
    assert (state["sampler"]["epoch"], state["sampler"]["offset"]) == (2, 128)
    assert state["loop"]["step"] == 40 and state["loop"]["optimizer_steps"] == 20


@pytest.mark.slow
def test_use_fsdp_launch_is_refused_before_torch_is_imported(launch, tmp_path):
    job = launch.accelerate_launch(
        CHILD,
        str(tmp_path),
        "probe",
        launch_args=("--use_fsdp", "--num_processes=2", f"--main_process_port={launch.free_port()}"),
        env={"HF_HOME": str(tmp_path), **NO_GPU},
        timeout_s=90,
    )
    assert job.returncode != 0 and not job.timed_out, job.describe()
    err = job.stderr
    assert "GUARD_REFUSED (torch imported: False)" in err
    assert "ACCELERATE_USE_FSDP=true" in err and "FSDP_SHARDING_STRATEGY=" in err
    # the library speaks config paths (a foreign script has no flags); lerobot-train prints them as flags
    assert "LEROBOT_ALLOW_ACCELERATE_ENV=1" in err and "parallelism.dp_shard=N" in err
    assert "exitcode  : 2" in job.output


def test_lerobot_train_refuses_the_fsdp_env_before_importing_torch(launch, tmp_path):
    """The claim is about ``lerobot-train`` itself, so it runs with exactly the variables
    ``accelerate launch --use_fsdp`` exports and a ``torch`` that cannot be imported: any import of
    torch before the refusal would end in that ImportError instead of the guard's line."""
    import shutil
    import sys

    poisoned = tmp_path / "poisoned"
    (poisoned / "torch").mkdir(parents=True)
    (poisoned / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    exported = _exported_by_accelerate(["--use_fsdp", "--num_processes=2"])
    env = {k: v for k, v in exported.items() if k.startswith(("ACCELERATE_", "FSDP_"))}
    assert env.get("ACCELERATE_USE_FSDP") == "true", exported
    script = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
    demo = Path(__file__).resolve().parents[1] / "data" / "lerobot" / "demo_reach"
    res = launch.run_command(
        [
            script,
            "--dataset.repo_id=lerobot/demo_reach",
            f"--dataset.root={demo}",
            "--policy.type=mlp",
            f"--output_dir={tmp_path / 'out'}",
        ],
        timeout_s=60,
        env={**env, "PYTHONPATH": str(poisoned), **NO_GPU},
    )
    assert res.returncode == 2, res.describe()
    assert "torch was imported" not in res.output and "Traceback" not in res.output, res.describe()
    assert (
        res.stderr.startswith("lerobot-train: error: Refusing to start")
        and "ACCELERATE_USE_FSDP=true" in res.stderr
    )
    assert not (tmp_path / "out").exists()
