"""The real ``lerobot-train`` console script in a subprocess: help, usage errors, exit codes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")


def run(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SCRIPT, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def assert_usage_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[0].startswith("lerobot-train: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def test_help_lists_every_section_with_types_and_defaults():
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in (
        "--dataset.repo_id str|null",
        "--steps int",
        "(default: 100000)",
        "--policy.type {",
        "--parallelism.dp_shard int",
        "--accelerator.mixed_precision {no,bf16,fp16}",
        "--accelerator.gradient_accumulation.steps int",
        "--accelerator.fsdp.wrap_modules json list[str]|null",
        "--accelerator.fsdp.mixed_precision_policy.param_dtype {float32,bfloat16,float16}|null",
        "--checkpoint_format {safetensors,dcp,safetensors_dcp}",
        "--trackio.enable bool",
        "--peft.r int",
        "--config_path",
        "--policy.path",
    ):
        assert needle in out, needle
    for section in ("dataset:", "policy:", "optimizer:", "parallelism:", "accelerator.fsdp:", "trackio:"):
        assert f"\n{section}\n" in out, section


def test_help_with_policy_type_shows_its_fields():
    proc = run("--policy.type=mlp", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "fields of --policy.type=mlp" in proc.stdout
    assert "--policy.hidden_dim int" in proc.stdout
    assert "--policy.hidden_dim" not in run("--help").stdout


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from lerobot_cli.train import main\n"
        "try:\n    main(['--policy.type=mlp', '--help'])\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'numpy', 'accelerate', 'peft'))\n"
        "print('IMPORTED:', bad)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "IMPORTED: []" in proc.stdout


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--stpes=10"], ["unknown flag --stpes", "did you mean --steps?"]),
        (["--policy.type=mlp", "--policy.hiden_dim=3"], ["did you mean --policy.hidden_dim?"]),
        (["--steps=ten"], ["--steps", "expected an integer", "'ten'"]),
        (["--save_checkpoint=maybe"], ["--save_checkpoint", "expected a boolean"]),
        (["--dataset.episodes=0,3"], ["--dataset.episodes", "expected a JSON list"]),
        (["--accelerator.mixed_precision=fp8"], ["invalid choice 'fp8'", "no, bf16, fp16"]),
        (["--checkpoint_format=pickle"], ["invalid choice 'pickle'", "safetensors, dcp, safetensors_dcp"]),
        (["--policy.type=nope"], ["--policy.type: invalid choice 'nope'", "mlp"]),
        (
            ['--accelerator.fsdp.wrap_modules=["A"]', "--accelerator.fsdp.min_num_params=100"],
            ["wrap_modules", "min_num_params", "only one"],
        ),
        (["--policy.type=mlp", "--policy.path=somewhere"], ["--policy.type and --policy.path"]),
        (["--parallelism.dp_replicate=0"], ["--parallelism.dp_replicate must be ≥ 1, got 0"]),
        (["--parallelism.dp_shard=0"], ["--parallelism.dp_shard must be ≥ 1, or -1"]),
        (["--parallelism.dp_shard=-3"], ["--parallelism.dp_shard", "got -3"]),
        (
            ["--policy.type=mlp", "--dataset.repo_id=a/b", "--resume=true"],
            ["--resume=true has nothing to resume"],
        ),
        (["--policy.type=mlp"], ["no dataset"]),
        (["--dataset.repo_id=a/b"], ["no policy"]),
        (["stray"], ["unexpected argument 'stray'"]),
        (
            ["--accelerator.fsdp.ignored_modules=(unclosed"],
            ["ignored_modules is not a valid regular expression"],
        ),
        (["--accelerator.fsdp.mixed_precision_policy.reduce_dtype=float32"], ["param_dtype must be set"]),
    ],
)
def test_usage_errors(args, fragments):
    assert_usage_error(run(*args), *fragments)


def test_config_path_errors(tmp_path):
    assert_usage_error(run(f"--config_path={tmp_path / 'missing.json'}"), "does not exist")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_usage_error(run(f"--config_path={bad}"), str(bad), "not valid JSON")
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"stepz": 3}))
    assert_usage_error(run(f"--config_path={unknown}"), str(unknown), "unknown key(s) stepz")
    assert_usage_error(run(f"--config_path={tmp_path}"), "no train_config.json")


def test_existing_output_dir_is_refused_and_untouched(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    marker = out / "keep.txt"
    marker.write_text("precious")
    before = sorted(p.name for p in out.iterdir())
    proc = run("--policy.type=mlp", "--dataset.repo_id=a/b", f"--output_dir={out}", "--resume=false")
    assert_usage_error(proc, f"--output_dir={out} already exists", "--resume=true")
    assert sorted(p.name for p in out.iterdir()) == before and marker.read_text() == "precious"


DEMO = Path(__file__).resolve().parents[3] / "data" / "lerobot" / "demo_reach"


def test_dry_run_prints_the_config_and_the_sharding_plan(tmp_path):
    proc = run(
        "--policy.type=mlp",
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        f"--output_dir={tmp_path / 'o'}",
        "--dry_run=true",
        "--accelerator.gradient_accumulation.steps=4",
        "--parallelism.dp_shard=4",
        "--accelerator.mixed_precision=bf16",
    )
    assert proc.returncode == 0, proc.stderr
    data, end = json.JSONDecoder().raw_decode(proc.stdout)
    assert data["accelerator"]["gradient_accumulation"]["steps"] == 4
    assert data["policy"]["type"] == "mlp" and data["job_name"] == "lerobot_demo_reach_mlp"
    plan = proc.stdout[end:]
    assert "Sharding plan: fsdp on mesh (dp_shard=4)" in plan
    assert "(MLPBlock)" in plan and "Tied weights: none" in plan and "Estimated per-rank memory" in plan
    assert "x of the unsharded" in plan
    assert not (tmp_path / "o").exists()


def test_dry_run_refuses_a_plan_without_units(tmp_path):
    proc = run(
        "--policy.type=mlp",
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        f"--output_dir={tmp_path / 'o'}",
        "--dry_run=true",
        "--parallelism.dp_shard=2",
        '--accelerator.fsdp.wrap_modules=["Nope"]',
    )
    assert_usage_error(proc, "class name(s) Nope match no module", "MLPBlock")
