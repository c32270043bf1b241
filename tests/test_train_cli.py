"""``lerobot-train`` end to end on the shipped demo dataset: one process, torchrun DDP, resume.

Real processes and real files; the MLP policy keeps each launch to a few seconds, one ACT run checks
the real workload. Several checks share one launch because each launch costs seconds: the runs
that need nothing between them share one ``launch.lerobot_train_runs`` launch per process count
(fixtures ``two_proc`` and ``one_proc``; the mid-epoch resume's runs included).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
DATA = ["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}", "--num_workers=0"]
MLP = [*DATA, "--policy.type=mlp", "--policy.hidden_dim=32"]

pytestmark = pytest.mark.slow


def losses(output_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def _runs(launch, root: Path, runs: dict, nproc: int) -> dict[str, tuple[Path, object]]:
    """``runs`` (name -> flags, or a ``launch.TreeDigest``, which is no run) in ONE ``lerobot_train_runs``
    launch, in order; a run without ``--config_path`` writes to ``root/name``. Returns name ->
    (output_dir, RunOutput) for the runs, name -> (digest file, TreeDigest) for the digests."""
    items = [
        flags
        if isinstance(flags, launch.TreeDigest) or any(a.startswith("--config_path") for a in flags)
        else [*flags, f"--output_dir={root / name}"]
        for name, flags in runs.items()
    ]
    outs = iter(launch.lerobot_train_runs(*items, nproc=nproc))
    return {
        name: (flags.path, flags) if isinstance(flags, launch.TreeDigest) else (root / name, next(outs))
        for name, flags in runs.items()
    }


def _mid_epoch_resume(launch, root: Path, nproc: int) -> dict:
    """The mid-epoch resume's runs on ``nproc`` processes: a 20-step run, a 16-step run, its step-16
    checkpoint digested, and its resume to 20. Two episodes (98 frames) and a global batch of 8: an
    epoch ends after 12 steps, so the resume at step 16 (sample 128) is mid-epoch in epoch 1. ACT
    (dropout, VAE sampling) checks the RNG restore."""
    args = [
        *DATA,
        "--dataset.episodes=[0,1]",
        "--policy.type=act",
        "--policy.pretrained_backbone_weights=null",
        "--policy.dim_model=32",
        "--policy.dim_feedforward=64",
        "--policy.n_encoder_layers=1",
        "--policy.n_vae_encoder_layers=1",
        "--policy.chunk_size=5",
        "--policy.n_action_steps=5",
        f"--batch_size={8 // nproc}",
        "--log_freq=1",
        "--save_freq=16",
    ]
    half = root / "act_half"
    return {
        "act_full": [*args, "--steps=20"],
        "act_half": [*args, "--steps=16"],
        "act_at_16": launch.TreeDigest(half / "checkpoints" / "000016", root / "act_at_16.json"),
        "act_resumed": [
            "--resume=true",
            f"--config_path={half}/checkpoints/last/pretrained_model/train_config.json",
            "--steps=20",
        ],
    }


@pytest.fixture(scope="module")
def two_proc(launch, tmp_path_factory):
    """The file's 2-process runs, in one torchrun launch: the mid-epoch resume's first (their stderr is
    checked: nothing before them could have printed a once-per-process warning out of their sight),
    then DDP and FSDP2 on a global batch of 8, and the base run of the other-world-size resume (resumed
    in ``one_proc``)."""
    root = tmp_path_factory.mktemp("cli_x2")
    common = [*MLP, "--steps=4", "--log_freq=1", "--save_checkpoint=false", "--batch_size=4"]
    return _runs(
        launch,
        root,
        {
            **_mid_epoch_resume(launch, root, 2),
            "two": common,
            "fsdp": [*common, "--parallelism.dp_shard=-1"],
            "ws_two": [*MLP, "--batch_size=4", "--log_freq=2", "--save_freq=4", "--steps=4"],
        },
        nproc=2,
    )


@pytest.fixture(scope="module")
def one_proc(launch, tmp_path_factory, two_proc):
    """The file's 1-process runs in one launch. ``single`` comes first and must print nothing on stderr,
    the mid-epoch resume's runs next (no "warning" on their stderr), then the other-world-size resume
    (exactly one warning line): so nothing that a run might print only once per process can hide from
    a later run whose stderr is checked."""
    root = tmp_path_factory.mktemp("cli_x1")
    pretrained = root / "base" / "checkpoints" / "last" / "pretrained_model"
    return _runs(
        launch,
        root,
        {
            "single": [
                *MLP,
                "--steps=6",
                "--batch_size=4",
                "--log_freq=2",
                "--save_freq=4",
                "--accelerator.gradient_accumulation.steps=2",
            ],
            **_mid_epoch_resume(launch, root, 1),
            "ws_resumed": [
                "--resume=true",
                f"--config_path={two_proc['ws_two'][0]}/checkpoints/last",
                "--steps=6",
            ],
            "one": [*MLP, "--steps=4", "--log_freq=1", "--save_checkpoint=false", "--batch_size=8"],
            # lr=0: a fine-tune that cannot move the weights must save exactly what it loaded.
            "base": [*MLP, "--steps=3", "--log_freq=0"],
            "tuned": [*DATA, f"--policy.path={pretrained}", "--optimizer.lr=0", "--steps=2", "--log_freq=0"],
            "errors_run": [*MLP, "--steps=2", "--log_freq=0"],
        },
        nproc=1,
    )


def test_single_process_banner_metrics_and_checkpoints(one_proc):
    out, res = one_proc["single"]
    text = res.stdout
    assert "Effective batch size: 4 x 1 dp workers x 2 grad accum = 8" in text
    assert "topology dp_replicate=1 x dp_shard=1 (single process)" in text
    assert "1516 frames, 30 episodes" in text
    assert "not rescaled" in text
    assert res.stderr.strip() == "", res.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6]
    assert {"loss", "lr", "samples_per_s", "step_s", "data_s", "mse_loss"} <= set(records[0])
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["000004", "000006", "last"]
    assert (ckpts / "last").resolve().name == "000006"
    pretrained = ckpts / "last" / "pretrained_model"
    for name in (
        "config.json",
        "train_config.json",
        "model.safetensors",
        "policy_preprocessor.json",
        "policy_postprocessor.json",
    ):
        assert (pretrained / name).is_file(), name
    step = json.loads((ckpts / "last" / "training_state" / "training_step.json").read_text())
    assert (step["step"], step["grad_accum_steps"], step["batch_size"], step["dp_world_size"]) == (6, 2, 4, 1)


def test_only_the_main_rank_prints_the_banner(launch, two_proc):
    # every 2-process run prints it once: the launch's total says no other rank printed it in any run
    runs = [res for _, res in two_proc.values() if not isinstance(res, launch.TreeDigest)]
    assert sum(res.stdout.count("Effective batch size") for res in runs) == len(runs) == 6


def test_ddp_two_processes_match_one_process_on_the_same_global_batch(one_proc, two_proc):
    one, _ = one_proc["one"]
    two, res = two_proc["two"]
    assert "Effective batch size: 4 x 2 dp workers x 1 grad accum = 8" in res.stdout
    assert "topology dp_replicate=2 x dp_shard=1 (DDP)" in res.stdout
    assert res.stdout.count("Effective batch size") == 1  # only the main rank prints
    a, b = losses(one), losses(two)
    assert len(a) == len(b) == 4
    assert all(abs(x - y) <= 1e-5 for x, y in zip(a, b)), (a, b)


def test_fsdp_two_processes_match_one_process_on_the_same_global_batch(one_proc, two_proc):
    one, _ = one_proc["one"]
    two, res = two_proc["fsdp"]
    assert "topology dp_replicate=1 x dp_shard=2 (FSDP2)" in res.stdout
    assert "Sharding plan: fsdp on mesh (dp_shard=2)" in res.stdout and "(MLPBlock)" in res.stdout
    a, b = losses(one), losses(two)
    assert len(a) == len(b) == 4
    assert all(abs(x - y) <= 1e-5 for x, y in zip(a, b)), (a, b)


@pytest.mark.parametrize("nproc", [1, 2])
def test_resume_is_bitwise_equal_mid_epoch_after_the_first_epoch(one_proc, two_proc, nproc):
    runs = one_proc if nproc == 1 else two_proc  # see _mid_epoch_resume
    (full, full_res), (half, half_res), (_, at_16), (_, res) = (
        runs[name] for name in ("act_full", "act_half", "act_at_16", "act_resumed")
    )
    # the step-16 state, as the 16-step run left it (digested before the resume started)
    step_file = half / "checkpoints/000016/training_state/training_step.json"
    assert (
        at_16.read()["training_state/training_step.json"]
        == hashlib.sha256(step_file.read_bytes()).hexdigest()
    )
    state = json.loads(step_file.read_text())
    assert (state["sampler"]["epoch"], state["sampler"]["offset"]) == (1, 128 - 98)
    assert "resuming at step 16" in res.stdout
    # the resume's stderr, and the earlier runs' (a warning printed once per process would show there)
    for out in (full_res, half_res, res):
        assert "warning" not in out.stderr.lower(), out.stderr
    assert losses(half) == losses(full)  # bitwise: same floats, printed and parsed identically


def test_resume_on_another_world_size_warns_once(one_proc, two_proc):
    two, _ = two_proc["ws_two"]
    _, res = one_proc["ws_resumed"]
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("lerobot-train: warning:")]
    assert "WARNING" not in res.stderr  # one style for every warning
    assert len(warnings) == 1, res.stderr
    assert "world_size: 2 → 1" in warnings[0] and "sample-exactness is lost" in warnings[0]
    step = json.loads((two / "checkpoints/last/training_state/training_step.json").read_text())
    assert step["step"] == 6 and step["world_size"] == 1 and step["sampler"]["offset"] == 4 * 4 * 2 + 2 * 4


def test_policy_path_fine_tunes_from_the_saved_weights_and_processors(one_proc):
    base, _ = one_proc["base"]
    pretrained = base / "checkpoints" / "last" / "pretrained_model"
    tuned, res = one_proc["tuned"]
    assert "Policy: mlp" in res.stdout
    from safetensors.torch import load_file

    a = load_file(pretrained / "model.safetensors")
    b = load_file(tuned / "checkpoints" / "last" / "pretrained_model" / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    saved = json.loads((tuned / "checkpoints/last/pretrained_model/train_config.json").read_text())
    # `last` resolved: the run records the step directory it really loaded, which cannot move on
    assert (
        saved["policy"]["pretrained_path"] == str(pretrained.resolve())
        and saved["policy"]["hidden_dim"] == 32
    )
    assert pretrained.resolve().parent.name == "000003"
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        assert (tuned / "checkpoints/last/pretrained_model" / name).read_text() == (
            pretrained / name
        ).read_text()


def test_resume_errors_are_one_line_and_touch_nothing(launch, tmp_path, one_proc):
    run, _ = one_proc["errors_run"]
    step = run / "checkpoints" / "000002"

    def snapshot() -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}

    def refused(*args: str, fragment: str) -> None:
        before = snapshot()
        res = launch.run_command([SCRIPT, *args], timeout_s=120)
        assert res.returncode == 2, res.describe()
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lerobot-train: error: "), res.stderr
        assert fragment in lines[0], lines[0]
        assert snapshot() == before

    # flags that do not fit the saved weights
    refused(
        "--resume=true", f"--config_path={step}", "--policy.hidden_dim=16", "--steps=4", fragment="model."
    )
    # a truncated optimizer file
    opt = step / "training_state" / "optimizer_state.safetensors"
    data = opt.read_bytes()
    opt.write_bytes(data[: len(data) // 2])
    refused("--resume=true", f"--config_path={step}", "--steps=4", fragment="optimizer_state.safetensors")
    opt.write_bytes(data)
    # no training_state/ at all (only the weights were kept)
    shutil.move(step / "training_state", tmp_path / "kept_state")
    refused("--resume=true", f"--config_path={step}", "--steps=4", fragment="training_state")


def test_accelerate_launch_is_a_plain_launcher(launch, tmp_path):
    args = [*MLP, "--steps=2", "--log_freq=1", "--save_checkpoint=false"]
    # Without GPUs, --multi_gpu with ACCELERATE_USE_CPU=true is what starts two CPU processes.
    res = launch.accelerate_launch(
        SCRIPT,
        *args,
        f"--output_dir={tmp_path / 'multi'}",
        launch_args=("--multi_gpu", "--num_processes=2", f"--main_process_port={launch.free_port()}"),
        env={"ACCELERATE_USE_CPU": "true"},
        timeout_s=180,
    )
    assert res.returncode == 0, res.describe()
    assert "world size 2" in res.stdout and "(DDP)" in res.stdout and "Refusing" not in res.output
    # A plain --num_processes=2 starts ONE process on a machine without GPUs (accelerate's own rule).
    res = launch.accelerate_launch(
        SCRIPT, *args, f"--output_dir={tmp_path / 'plain'}", launch_args=("--num_processes=2",), timeout_s=180
    )
    assert res.returncode == 0, res.describe()
    assert "world size 1" in res.stdout and "(single process)" in res.stdout
