"""Tiny Diffusion Policy through ``lerobot-train`` on the demo dataset (camera + state + env state).

One process, DDP x2, FSDP2 x2 and HSDP 2x2 train the same global batches and log the same losses (step 1 to
1e-6, later steps to 1e-4; see the test): group norm in the backbone (no batch statistics) and each sample's
noise and timestep keyed by its dataset index make the layouts compute the same thing. FSDP2 shards the
U-Net's residual blocks and the camera encoder (its ``_fsdp_wrap_modules``) and writes a ``pretrained_model/``
with LeRobot's keys that loads back. A longer single-process run (the README's diffusion command) shows the
loss going down.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")

pytestmark = pytest.mark.slow

TINY = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=diffusion",
    "--policy.pretrained_backbone_weights=null",
    "--policy.use_group_norm=true",
    "--policy.down_dims=[16,32]",
    "--policy.horizon=8",
    "--policy.n_action_steps=4",
    "--policy.spatial_softmax_num_keypoints=8",
    "--policy.diffusion_step_embed_dim=16",
    "--policy.num_train_timesteps=20",
    "--policy.scheduler_warmup_steps=0",
]


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def readme_command() -> list[str]:
    """The flags of the diffusion command in packages/lerobot-cli/README.md
    (``uv run lerobot-train`` dropped)."""
    text = (REPO / "packages" / "lerobot-cli" / "README.md").read_text()
    block = text.split("<!-- diffusion-command", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:3] == ["uv", "run", "lerobot-train"], words[:3]
    return words[3:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch) -> dict[str, tuple[Path, str]]:
    """Three launches: one process (the layout reference, then the README's longer command), x2 (DDP,
    FSDP2, FSDP2 bf16 with batch norm) and x4 (HSDP 2x2); the same global batch of 8 in every layout run."""
    root = tmp_path_factory.mktemp("diffusion")
    common = [*TINY, "--policy.optimizer_lr=1e-4", "--steps=4", "--log_freq=1"]
    out = {name: root / name for name in ("single", "long", "ddp", "fsdp", "bf16", "hsdp")}
    readme = [
        f.replace("data/lerobot/demo_reach", str(DEMO))
        for f in readme_command()
        if not f.startswith("--output_dir=")
    ]
    assert "--steps=60" in readme and "--policy.type=diffusion" in readme
    no_gn = [f for f in TINY if f != "--policy.use_group_norm=true"]
    # the reference and HSDP keep an EMA (LeRobot's warmup schedule), saved after updates 3 and 4 (the last
    # step is always saved): the shadow of update 4 is replayed from those of 3
    ema = ["--ema.enable=true", "--save_freq=3"]
    one = launch.lerobot_train_runs(
        [*common, *ema, "--batch_size=8", f"--output_dir={out['single']}"],
        [*readme, "--log_freq=10", "--save_checkpoint=false", f"--output_dir={out['long']}"],
    )
    two = launch.lerobot_train_runs(
        [*common, "--batch_size=4", "--save_checkpoint=false", f"--output_dir={out['ddp']}"],
        [
            *common,
            "--batch_size=4",
            "--parallelism.dp_shard=2",
            "--save_freq=4",
            f"--output_dir={out['fsdp']}",
        ],
        # LeRobot's default backbone (trainable batch norm, fp32 running statistics) under FSDP2 with
        # parameters gathered in bf16
        [
            *no_gn,
            "--policy.optimizer_lr=1e-3",
            "--steps=2",
            "--log_freq=1",
            "--batch_size=4",
            "--parallelism.dp_shard=2",
            "--accelerator.mixed_precision=bf16",
            "--save_checkpoint=false",
            f"--output_dir={out['bf16']}",
        ],
        nproc=2,
    )
    four = launch.lerobot_train(
        *common,
        *ema,
        "--batch_size=2",
        "--parallelism.dp_replicate=2",
        "--parallelism.dp_shard=2",
        f"--output_dir={out['hsdp']}",
        nproc=4,
    )
    stdout = {
        "single": one[0].stdout,
        "long": one[1].stdout,
        "ddp": two[0].stdout,
        "fsdp": two[1].stdout,
        "bf16": two[2].stdout,
        "hsdp": four.stdout,
    }
    return {name: (out[name], stdout[name]) for name in out}


def test_layouts_log_the_same_losses(runs):
    reference = losses(runs["single"][0])
    assert sorted(reference) == [1, 2, 3, 4]
    assert "topology dp_replicate=2 x dp_shard=2 (HSDP)" in runs["hsdp"][1]
    for name in ("ddp", "fsdp", "hsdp"):
        got = losses(runs[name][0])
        assert sorted(got) == sorted(reference), name
        for step, loss in reference.items():
            # Step 1 runs the same weights (only the reductions' order differs: measured ~1e-7). Later steps
            # follow updates whose gradients were reduced in another order; Adam's normalised update turns
            # those last-bit differences (tiny gradients included) into lr-sized weight differences, which the
            # camera's ResNet and spatial softmax amplify: measured up to ~1.5e-5 at step 4.
            tol = 1e-6 if step == 1 else 1e-4
            assert abs(got[step] - loss) <= tol * max(1.0, abs(loss)), (name, step, got[step], loss)


def test_fsdp2_shards_residual_blocks_and_the_camera_encoder_and_saves_lerobot_keys(runs):
    import torch
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy
    from lerobot_cli.policies.pretrained import load_pretrained
    from safetensors.torch import load_file

    out, stdout = runs["fsdp"]
    # 2 down stages x 2 + 2 middle + 1 up stage x 2 residual blocks, and one camera encoder
    assert "Wrap units from the diffusion policy's PolicySpec.wrap_units: 9 unit(s) + the root" in stdout, (
        stdout
    )
    assert "DiffusionConditionalResidualBlock1d" in stdout and "DiffusionRgbEncoder" in stdout
    model_dir = out / "checkpoints" / "000004" / "pretrained_model"
    weights = load_file(model_dir / "model.safetensors")
    cfg, policy = load_pretrained(model_dir)
    assert cfg.use_group_norm and cfg.down_dims == (16, 32)
    assert isinstance(policy, DiffusionPolicy) and set(policy.state_dict()) == set(weights)
    assert "diffusion.rgb_encoder.0.backbone.4.0.bn1.weight" in weights  # group norm: weight/bias only
    assert "diffusion.unet.mid_modules.0.cond_encoder.1.weight" in weights
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in weights.items())
    assert json.loads((model_dir / "config.json").read_text())["type"] == "diffusion"


def test_readme_command_trains_and_the_loss_goes_down(runs):
    got = list(losses(runs["long"][0]).values())
    assert len(got) == 6
    # diffusion losses are noisy step to step (random timesteps): compare the first and last two logs
    assert sum(got[-2:]) < 0.85 * sum(got[:2]), got


def test_fsdp2_bf16_with_lerobots_batch_norm_backbone(runs):
    out, stdout = runs["bf16"]
    assert "parameters all-gathered in bfloat16" in stdout
    got = losses(out)
    assert sorted(got) == [1, 2] and all(0 < v < 10 for v in got.values()), got


def test_dry_run_plans_full_size_diffusion_and_offline_weights_are_one_error_line(launch):
    base = [
        SCRIPT,
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--policy.type=diffusion",
        "--dry_run=true",
        "--parallelism.dp_shard=4",
    ]
    res = launch.run_command([*base, "--policy.pretrained_backbone_weights=null"], timeout_s=120)
    assert res.returncode == 0, res.describe()
    # LeRobot's default size with the demo's features (state 2, env state 2, one camera, action 2)
    assert "Policy: diffusion; parameters 262,823,714" in res.stdout, res.stdout
    assert "Wrap units from the diffusion policy's PolicySpec.wrap_units: 13 unit(s) + the root" in res.stdout
    assert "(0.250x of the unsharded" in res.stdout
    with socket.socket() as sock:  # a mirror address nothing listens on: the download fails at once, offline
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    res = launch.run_command(
        base,
        timeout_s=120,
        env={"TORCH_HOME": "/nonexistent-torch-home", "LEROBOT_BACKBONE_WEIGHTS_URL": closed},
    )
    assert res.returncode == 2, res.describe()
    assert "Traceback" not in res.output
    assert "pass --policy.pretrained_backbone_weights=null for a randomly initialised backbone" in res.stderr


def test_hsdp_keeps_the_ema_of_its_shards_as_one_process_does(runs):
    """HSDP 2x2: each rank's EMA of its shards (replicated across the 2 groups), gathered into
    pretrained_model_ema/ with every key; it follows the one-process EMA as closely as the weights follow
    the one-process weights (reduction order, amplified by Adam: see the losses test). Both would also
    agree if the update did nothing, so each run's 4th update is replayed from the shadow it saved after
    the 3rd and the weights it saved after the 4th, bitwise (tests/ema_replay.py)."""
    import torch
    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location(
        "lerobot_tests_ema_replay", Path(__file__).parent / "ema_replay.py"
    )
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    for name in ("single", "hsdp"):
        replay.assert_ema_replays(runs[name][0], [3, 4])

    def files(name):
        step = runs[name][0] / "checkpoints" / "000004"
        return (
            load_file(step / "pretrained_model" / "model.safetensors"),
            load_file(step / "pretrained_model_ema" / "model.safetensors"),
        )

    (live_1, ema_1), (live_h, ema_h) = files("single"), files("hsdp")
    assert ema_h.keys() == ema_1.keys() == live_h.keys()
    assert "kept by each rank of its own shards" in runs["hsdp"][1]
    gap = max((ema_h[k] - ema_1[k]).abs().max().item() for k in ema_1)
    weights_gap = max((live_h[k] - live_1[k]).abs().max().item() for k in live_1)
    assert gap <= max(2 * weights_gap, 1e-6), (gap, weights_gap)
    assert any(not torch.equal(ema_h[k], live_h[k]) for k in ema_h)  # averaged, not a copy
