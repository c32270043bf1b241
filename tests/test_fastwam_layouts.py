"""Tiny FastWAM through ``lerobot-train`` on the demo dataset on every layout, and the full-size dry run.

One process, DDP x2, FSDP2 x2 (the tiny model's 2 ``MoTLayer`` units + the root) and HSDP 2x2 train the same
global batches and log the same losses. FSDP2 x2 writes DCP checkpoints (shards only); ``lerobot-convert-dcp``
turns one into ``model.safetensors`` with LeRobot's keys (a FastWAMPolicy loads it strictly), and that
checkpoint, its shards deleted by the converter, resumes on one process and on DDP x2: the losses go on as the
uninterrupted FSDP2 run's. ``--dry_run=true`` plans LeRobot's full-size FastWAM (6 B parameters) for 8 GPUs
with bf16 on the meta device in seconds, with no VAE, UMT5 or base weights anywhere (an empty, offline Hugging
Face cache), and ``--accelerator.fsdp.wrap_modules='["MoTLayer"]'`` plans the same.

Every run is a real ``lerobot-train`` (its ``main``): the training runs share four launches
(``launch.lerobot_train_runs``: 2, 1, 4 and again 2 processes, each launch's runs one after another in the
same ranks; ~80 s for the file on 2 CPU cores); the dry runs are plain console-script processes.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest
from fastwam_flags import DEMO_FASTWAM

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
BIN = Path(sys.executable).parent
LEROBOT_TRAIN, CONVERT = str(BIN / "lerobot-train"), str(BIN / "lerobot-convert-dcp")

pytestmark = pytest.mark.slow

# The README's tiny FastWAM on the demo (packages/lerobot-cli/tests/test_fastwam_demo.py): tiny DiTs and a
# tiny VAE/UMT5 built from config, the bundled byte-level tokenizer; a 5-frame 32x32 video, 8-step chunks.
TINY = [*DEMO_FASTWAM, "--policy.optimizer_lr=1e-3", "--log_freq=1"]
GLOBAL_BATCH = 8
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def batch(nproc_data: int) -> str:
    return f"--batch_size={GLOBAL_BATCH // nproc_data}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch) -> dict[str, Path | str]:
    """Every training run of this file, in four launches; ``runs[name]`` is a run's output directory and
    ``runs[name + ".stdout"]`` what it printed. The FSDP2 run's step-4 checkpoint is converted between the
    launches (its copy, ``runs["converted"]``, loses its shards), so the later launches resume from it."""
    root = tmp_path_factory.mktemp("fastwam")
    names = ("ddp", "fsdp", "frozen", "single", "resumed_single", "hsdp", "resumed_ddp", "size_rule")
    out: dict[str, Path | str] = {name: root / name for name in names}
    steps = [*TINY, "--steps=4", "--save_checkpoint=false"]
    two = {
        "ddp": [*steps, batch(2)],
        # 6 steps, DCP shards at 4 and 6 (the resumed runs continue its step 4)
        "fsdp": [
            *TINY,
            "--steps=6",
            "--save_freq=4",
            batch(2),
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
        ],
        # the video expert frozen in bf16 beside the trained action expert's fp32 masters, in one unit each
        "frozen": [
            *(f for f in TINY if f != "--policy.torch_dtype=float32"),
            "--policy.torch_dtype=bfloat16",
            "--policy.freeze_video_expert=true",
            "--accelerator.mixed_precision=bf16",
            "--steps=4",
            "--save_freq=2",
            batch(2),
            "--parallelism.dp_shard=2",
        ],
    }
    for name, flags in two.items():
        flags.append(f"--output_dir={out[name]}")
    printed = launch.lerobot_train_runs(*two.values(), nproc=2, env=OFFLINE)
    out.update({f"{name}.stdout": p.stdout for name, p in zip(two, printed, strict=True)})

    converted = root / "converted"
    shutil.copytree(out["fsdp"] / "checkpoints" / "000004", converted)
    res = launch.run_command(
        [CONVERT, f"--checkpoint_dir={converted}", "--delete_dcp=true"], timeout_s=120, env=OFFLINE
    )
    assert res.returncode == 0, res.describe()
    out["converted"], out["convert.stdout"] = converted, res.stdout

    # the checkpoint's topology (dp_shard=2) replaced by this launch's
    resume = ["--resume=true", f"--config_path={converted}", "--parallelism.dp_shard=1"]
    one = {
        "single": [*steps, batch(1)],
        "resumed_single": [*resume, batch(1)],
    }
    four = {
        "hsdp": [*steps, batch(4), "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"],
    }
    two_again = {
        "resumed_ddp": [*resume, batch(2)],
        # a size rule small enough to make the video expert's fp32 time projection (6,336 parameters) a unit
        # of its own: its forward must run for FSDP to gather it
        "size_rule": [*steps, batch(2), "--parallelism.dp_shard=2", "--accelerator.fsdp.min_num_params=6000"],
    }
    for nproc, group in ((1, one), (4, four), (2, two_again)):
        for name, flags in group.items():
            flags.append(f"--output_dir={out[name]}")
        printed = launch.lerobot_train_runs(*group.values(), nproc=nproc, env=OFFLINE)
        out.update({f"{name}.stdout": p.stdout for name, p in zip(group, printed, strict=True)})
    return out


def metrics(out: Path) -> dict[int, dict[str, float]]:
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: {k: r[k] for k in ("loss", "loss_video", "loss_action")} for r in rows}


def test_every_layout_logs_the_same_losses(runs):
    """The loss and both parts at every step, to 1e-5 relative: each sample's noise and timesteps follow its
    dataset index whichever rank draws them, so the layouts differ only in the order float32 sums run (the
    gradient reductions, the batch means): measured <= 1.2e-7 relative over 4 steps. Draws that followed
    the rank's share of the batch instead (the global RNG per micro-batch) are off by 3e-3 and more."""
    reference = metrics(runs["single"])
    assert sorted(reference) == [1, 2, 3, 4]
    assert "topology dp_replicate=2 x dp_shard=2 (HSDP)" in runs["hsdp.stdout"]
    for name in ("ddp", "fsdp", "hsdp"):
        got = metrics(runs[name])
        for step, parts in reference.items():
            for key, value in parts.items():
                assert abs(got[step][key] - value) <= 1e-5 * max(1.0, abs(value)), (name, step, key)


def test_frozen_video_expert_stays_bitwise_under_fsdp2_with_bf16(runs):
    """Each MoTLayer unit holds the frozen video block in bf16 and the action block's fp32 masters (bf16
    mixed precision): FSDP2 gathers both in bf16, and from step 2 to step 4 the video expert has not moved
    by a bit while the action expert has."""
    from safetensors.torch import load_file

    stdout = runs["frozen.stdout"]
    assert "parameters all-gathered in bfloat16" in stdout and "2 unit(s) + the root" in stdout
    saved = runs["frozen"] / "checkpoints"
    at = {s: load_file(saved / f"{s:06d}" / "pretrained_model" / "model.safetensors") for s in (2, 4)}
    video = [k for k in at[2] if ".blocks.video." in k or ".mixtures.video." in k]
    action = [k for k in at[2] if ".blocks.action." in k or ".mixtures.action." in k]
    assert video and action and at[2].keys() == at[4].keys()
    assert all(torch_equal(at[2][k], at[4][k]) for k in video)
    assert {str(at[4][k].dtype) for k in video} == {"torch.bfloat16"}
    assert {str(at[4][k].dtype) for k in action} == {"torch.float32"}
    assert sum(not torch_equal(at[2][k], at[4][k]) for k in action) > len(action) // 2


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_a_size_rule_unit_inside_the_fp32_time_path_is_gathered(runs):
    """``--accelerator.fsdp.min_num_params=6000`` makes ``time_projection.1`` (an fp32 linear of the video
    expert) a unit of its own. It computes in its own ``forward`` (``Fp32Linear``), so FSDP's hook gathers
    it; computed outside its call, every rank failed at step 1 ("mixed torch.Tensor and DTensor")."""
    stdout = runs["size_rule.stdout"]
    assert "model.mot.mixtures.video.time_projection.1 (Fp32Linear)" in stdout, stdout[-3000:]
    reference, got = metrics(runs["single"]), metrics(runs["size_rule"])
    assert sorted(got) == [1, 2, 3, 4]
    for step, parts in reference.items():
        for key, value in parts.items():
            assert abs(got[step][key] - value) <= 1e-5 * max(1.0, abs(value)), (step, key)


def test_fsdp2_shards_each_mot_layer(runs):
    stdout = runs["fsdp.stdout"]
    assert "Wrap units from the fastwam policy's PolicySpec.wrap_units: 2 unit(s) + the root" in stdout
    assert "model.mot.layers.0 (MoTLayer)" in stdout and "model.mot.layers.1 (MoTLayer)" in stdout


def test_dcp_checkpoint_converts_to_lerobot_keys(runs):
    import torch
    from lerobot_cli.policies.weights import load_policy
    from safetensors.torch import load_file

    shards = runs["fsdp"] / "checkpoints" / "000004" / "pretrained_model"
    converted = runs["converted"] / "pretrained_model"
    assert any(p.is_dir() and p.name.startswith("pytorch_model_fsdp") for p in shards.iterdir())
    assert not (shards / "model.safetensors").exists()
    assert not any(p.name.startswith("pytorch_model_fsdp") for p in converted.iterdir())  # --delete_dcp
    weights = load_file(converted / "model.safetensors")
    assert "model.mot.layers.1.blocks.action.self_attn.q.weight" in weights
    assert "model.mot.mixtures.video.patch_embedding.weight" in weights
    _, policy = load_policy(converted)  # strict: every key, no other
    state = policy.state_dict()
    assert set(state) == set(weights) and all(torch.equal(state[k], weights[k]) for k in weights)


@pytest.mark.parametrize("name", ["resumed_single", "resumed_ddp"])
def test_converted_checkpoint_resumes_on_another_topology_and_the_loss_goes_on(runs, name):
    """FSDP2 x2's step-4 checkpoint, converted (its shards deleted), resumed on one process and on DDP x2:
    steps 5 and 6 log the uninterrupted FSDP2 run's losses (the restored weights, optimizer state and
    random state; one process draws for the whole global batch as the ranks together did)."""
    got, want = metrics(runs[name]), metrics(runs["fsdp"])
    assert sorted(got) == [5, 6] and sorted(want) == [1, 2, 3, 4, 5, 6]
    for step, parts in got.items():
        for key, value in parts.items():
            assert abs(value - want[step][key]) <= 1e-5 * max(1.0, abs(want[step][key])), (name, step, key)


# -- the dry run at full size ----------------------------------------------------------------------------


def _closed_url() -> str:
    with socket.socket() as sock:  # a Hub address nothing listens on: any download fails at once
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/"


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory, launch) -> dict[str, str]:
    """``--dry_run=true`` (in seconds: ~6 s measured, 120 s the bound) at LeRobot's full size (the demo's
    2-D state and action) for FSDP2 x8 with bf16: the spec's units and the same units named by
    --accelerator.fsdp.wrap_modules. An empty Hugging Face cache
    that is offline and a closed Hub address: the VAE, UMT5, its tokenizer and lerobot/fastwam_base cannot be
    found, so a run that reached for any of them would fail."""
    empty = tmp_path_factory.mktemp("empty_hf_home")
    env = {**OFFLINE, "HF_HOME": str(empty), "HF_ENDPOINT": _closed_url()}
    base = [
        LEROBOT_TRAIN,
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--policy.type=fastwam",
        "--policy.action_dim=2",
        "--policy.proprio_dim=2",
        "--dry_run=true",
        "--parallelism.dp_shard=8",
        "--accelerator.mixed_precision=bf16",
    ]
    out = {}
    for name, extra in (("spec", []), ("flag", ['--accelerator.fsdp.wrap_modules=["MoTLayer"]'])):
        res = launch.run_command([*base, *extra], timeout_s=120, env=env)
        assert res.returncode == 0, res.describe()
        out[name] = res.stdout
    assert not any(empty.iterdir())  # nothing looked up into the cache, nothing downloaded
    return out


# LeRobot's default FastWAM with the demo's 2-D action and state: 6,020,710,599 - 5 x 1,024 - 5 x 1,025 (the
# action encoder and head) - 6 x 4,096 (the proprio encoder) parameters.
DEMO_FULL = 6_020_675_778


def test_dry_run_plans_full_size_fastwam_on_eight_gpus_without_loading_anything(dry_runs):
    plan = dry_runs["spec"].split("\nPolicy: ", 1)[1]
    assert plan.startswith(f"fastwam; parameters {DEMO_FULL:,} (learnable {DEMO_FULL:,})")
    assert "Sharding plan: fsdp on mesh (dp_shard=8)" in plan
    assert "Wrap units from the fastwam policy's PolicySpec.wrap_units: 30 unit(s) + the root" in plan
    assert "MoTLayer x30 (197,257,216 params each), first model.mot.layers.0" in plan
    assert "<root> (FastWAMPolicy): 102,959,298 params" in plan  # DEMO_FULL - 30 x 197,257,216
    assert "parameters all-gathered in bfloat16" in plan and "fp32 master weights" in plan
    # 16 bytes per parameter (fp32 master, gradient, AdamW's two states) over 8 ranks, padding included
    assert "2.81 GiB + 2.81 GiB + 5.61 GiB = 11.22 GiB on device (0.125x of the unsharded 89.72 GiB)" in plan
    # beside the shards, whole on every rank (parameters counted on the meta device, bf16)
    assert (
        "Frozen, outside the plan, on every rank: the Wan2.2 VAE 1.31 GiB and UMT5 10.58 GiB, in bfloat16; "
        "--policy.precompute_task_contexts=true keeps UMT5 off every rank while training (1.00 MiB of "
        "context per task instead)"
    ) in plan


def test_wrap_modules_flag_plans_the_same_units(dry_runs):
    spec, flag = (dry_runs[k].split("\nPolicy: ", 1)[1] for k in ("spec", "flag"))
    assert "Wrap units from --accelerator.fsdp.wrap_modules: 30 unit(s) + the root" in flag
    source = "the fastwam policy's PolicySpec.wrap_units"
    assert flag == spec.replace(source, "--accelerator.fsdp.wrap_modules")
