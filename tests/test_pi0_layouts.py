"""Tiny pi0 through ``lerobot-train`` on the demo dataset (camera + state + task) on every layout.

One process, DDP x2, FSDP2 x2 and HSDP 2x2 train the same global batches: their reduced losses agree
(each sample's flow noise and time follow its dataset index, not its rank). The FSDP2 run writes all
three checkpoint formats; its DCP checkpoint converts to one ``model.safetensors`` with LeRobot's keys,
and HSDP 2x2 resumes such a checkpoint (of a 6-step run) as that run went on: the same losses and
weights. A 100-step run shows the loss going down, and ``--dry_run`` plans the full-size pi0 (LeRobot's
parameter count) without allocating it. Tiny pi05 (same towers, adaRMS time
conditioning, quantile-normalised state in the prompt) trains alike on one process and FSDP2 x2.

Every run is a real ``lerobot-train`` (its ``main``), but they share three launches (the ``runs``
fixture, ``launch.lerobot_train_runs``): the one-process runs, the x2 runs and the x4 runs, each
launch's runs one after another in the same ranks, so start-up is paid three times instead of twelve.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
TOKENIZER_BUILDER = REPO / "packages" / "lerobot-cli" / "tests" / "vla_tokenizer.py"
DEMO_BUILDER = REPO / "tools" / "make_demo_dataset.py"

pytestmark = pytest.mark.slow


def tiny_pi0(tokenizer: Path, policy: str = "pi0", root: Path = DEMO) -> list[str]:
    return [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={root}",
        "--num_workers=0",
        f"--policy.type={policy}",
        "--policy.paligemma_variant=gemma_tiny",
        "--policy.action_expert_variant=gemma_tiny",
        "--policy.vision_variant=tiny",
        "--policy.image_resolution=[56,56]",
        "--policy.chunk_size=10",
        "--policy.n_action_steps=10",
        f"--policy.tokenizer_name={tokenizer}",
        "--log_freq=1",
    ]


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return _load("vla_tokenizer", TOKENIZER_BUILDER).save_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def _demo(root: Path = DEMO) -> list[str]:
    return ["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={root}", "--num_workers=0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch, tokenizer, demo_with_quantiles) -> dict[str, Path | str]:
    """Every run of this file, in three launches; ``runs[name]`` is a run's output directory and
    ``runs[name + ".stdout"]`` what it printed."""
    root = tmp_path_factory.mktemp("pi0")
    names = (
        "single",
        "long",
        "pi05_single",
        "dry_run",
        "ddp",
        "fsdp",
        "fsdp6",
        "frozen",
        "lora",
        "pi05_fsdp",
        "hsdp",
        "resumed",
    )
    out: dict[str, Path | str] = {name: root / name for name in names}
    common = [*tiny_pi0(tokenizer), "--steps=4", "--save_freq=4"]
    base = out["single"] / "checkpoints" / "000004" / "pretrained_model"  # written by the first launch
    pi05 = [*tiny_pi0(tokenizer, policy="pi05", root=demo_with_quantiles), "--steps=3"]
    one_process = {
        "single": [*common, "--batch_size=8", f"--output_dir={out['single']}"],
        # decay_lr = peak: a constant 1e-3 after the fitted warm-up
        # (the preset would decay to 2.5e-6 in 100 steps)
        "long": [
            *tiny_pi0(tokenizer),
            "--steps=100",
            "--batch_size=8",
            "--save_checkpoint=false",
            "--log_freq=10",
            "--policy.optimizer_lr=1e-3",
            "--policy.scheduler_decay_lr=1e-3",
            f"--output_dir={out['long']}",
        ],
        "pi05_single": [
            *pi05,
            "--batch_size=8",
            "--save_checkpoint=false",
            f"--output_dir={out['pi05_single']}",
        ],
        "dry_run": [*_demo()[:2], "--policy.type=pi0", "--dry_run=true", "--parallelism.dp_shard=4"],
    }
    fine_tune = [
        *_demo(),
        f"--policy.path={base}",
        "--parallelism.dp_shard=2",
        "--batch_size=4",
        "--steps=2",
        "--save_freq=2",
        "--log_freq=1",
        "--policy.optimizer_lr=1e-3",
    ]
    two_processes = {
        "ddp": [*common, "--batch_size=4", f"--output_dir={out['ddp']}"],
        "fsdp": [
            *common,
            "--batch_size=4",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
            f"--output_dir={out['fsdp']}",
        ],
        # 6 steps uninterrupted, saved at step 4 (DCP): what the HSDP resume of that checkpoint must continue
        "fsdp6": [
            *tiny_pi0(tokenizer),
            "--steps=6",
            "--save_freq=4",
            "--batch_size=4",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
            f"--output_dir={out['fsdp6']}",
        ],
        # with openpi's EMA (constant decay 0.99; update_after_step 0: the first update copies)
        "frozen": [
            *fine_tune,
            "--policy.freeze_vision_encoder=true",
            "--accelerator.mixed_precision=bf16",
            "--ema.enable=true",
            "--ema.decay=0.99",
            f"--output_dir={out['frozen']}",
        ],
        "lora": [*fine_tune, "--peft.r=4", f"--output_dir={out['lora']}"],
        "pi05_fsdp": [
            *pi05,
            "--batch_size=4",
            "--parallelism.dp_shard=2",
            "--save_freq=3",
            f"--output_dir={out['pi05_fsdp']}",
        ],
    }
    hsdp = ["--batch_size=2", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"]
    four_processes = {
        "hsdp": [*common, *hsdp, f"--output_dir={out['hsdp']}"],
        # the 6-step FSDP2 x2 run's step-4 DCP checkpoint resumed on HSDP 2x2, in a directory of its own
        "resumed": [
            "--resume=true",
            f"--config_path={out['fsdp6'] / 'checkpoints' / '000004'}",
            f"--output_dir={out['resumed']}",
            *hsdp,
        ],
    }
    for nproc, group in ((1, one_process), (2, two_processes), (4, four_processes)):
        printed_runs = launch.lerobot_train_runs(*group.values(), nproc=nproc)
        out.update(
            {f"{name}.stdout": printed.stdout for name, printed in zip(group, printed_runs, strict=True)}
        )
    return out


def test_every_layout_computes_the_same_losses(runs):
    reference = losses(runs["single"])
    assert sorted(reference) == [1, 2, 3, 4]
    for name in ("ddp", "fsdp", "hsdp"):
        got = losses(runs[name])
        assert sorted(got) == sorted(reference), name
        for step, loss in reference.items():
            assert abs(got[step] - loss) <= 1e-5 * max(1.0, abs(loss)), (name, step, got[step], loss)


def test_sharded_checkpoint_converts_to_lerobot_keys_and_resumes_on_hsdp(runs, tmp_path):
    import torch
    from lerobot_ckpt import convert_dcp
    from lerobot_cli.policies.pi0.modeling import PI0Policy
    from lerobot_cli.policies.serialization import load_policy_config
    from safetensors.torch import load_file

    checkpoint = runs["fsdp"] / "checkpoints" / "000004"
    gathered = load_file(checkpoint / "pretrained_model" / "model.safetensors")
    copy = tmp_path / "converted"
    shutil.copytree(checkpoint, copy)
    (copy / "pretrained_model" / "model.safetensors").unlink()
    weights = load_file(convert_dcp(copy).output)
    assert weights.keys() == gathered.keys()
    assert all(torch.equal(weights[k], gathered[k]) for k in weights)
    assert (
        "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight"
        in weights
    )
    policy = PI0Policy(load_policy_config(checkpoint / "pretrained_model"))
    assert set(policy.state_dict()) == set(weights)
    policy.load_state_dict(weights, strict=True)

    # A 6-step FSDP2 x2 run's 000004 resumed on HSDP 2x2 (the fixture) continues that run: its steps 5 and 6
    # log the uninterrupted run's losses, as the layouts agree (step 5 runs the restored weights and each
    # sample's restored noise; step 6 also the restored optimizer state), and end at its weights. A resume
    # that restored nothing, or not the optimizer, or drew other noise, is far outside that.
    resumed, uninterrupted = runs["resumed"], runs["fsdp6"]
    got, want = losses(resumed), losses(uninterrupted)
    assert sorted(got) == [5, 6] and sorted(want) == [1, 2, 3, 4, 5, 6]
    for step, loss in got.items():
        assert abs(loss - want[step]) <= 1e-5 * max(1.0, abs(want[step])), (step, loss, want[step])
    at = {
        name: load_file(run / "checkpoints" / f"{step:06d}" / "pretrained_model" / "model.safetensors")
        for name, run, step in (
            ("resumed", resumed, 6),
            ("uninterrupted", uninterrupted, 6),
            ("start", uninterrupted, 4),
        )
    }
    assert at["resumed"].keys() == at["uninterrupted"].keys() == weights.keys()
    gap = max((at["resumed"][k] - at["uninterrupted"][k]).abs().max().item() for k in weights)
    moved = max((at["uninterrupted"][k] - at["start"][k]).abs().max().item() for k in weights)
    assert gap <= 1e-5 and moved > 100 * gap, (gap, moved)


def test_loss_goes_down_over_100_steps(runs):
    got = list(losses(runs["long"]).values())
    assert len(got) == 10
    # Flow-matching losses are noisy step to step (random times): compare the first and last three logs.
    assert sum(got[-3:]) < 0.85 * sum(got[:3]), got


def test_dry_run_plans_full_size_pi0_without_allocating(runs):
    stdout = runs["dry_run.stdout"]  # the run exited 0: launch.lerobot_train_runs asserts it
    assert "Policy: pi0; parameters 4,028,019,472" in stdout
    assert "PaliGemmaLayer+ExpertLayer x18" in stdout and "SiglipEncoderLayer x27" in stdout
    assert "(0.250x of the unsharded" in stdout


def _weights(directory: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


def test_frozen_vision_tower_stays_bitwise_under_fsdp2_with_bf16(runs):
    """Fine-tune the single run's policy under FSDP2 x2 with bf16 mixed precision and a frozen SigLIP:
    the vision weights come back bit for bit, the rest moved, and the masters are saved in fp32."""
    base = runs["single"] / "checkpoints" / "000004" / "pretrained_model"
    out = runs["frozen"]
    assert "parameters all-gathered in bfloat16" in runs["frozen.stdout"]
    before, after = _weights(base), _weights(out / "checkpoints" / "000002" / "pretrained_model")
    assert before.keys() == after.keys()
    vision = [k for k in before if ".vision_tower." in k]
    assert vision and all(torch_equal(before[k], after[k]) for k in vision)
    moved = [k for k in before if ".gemma_expert.model.layers." in k and not torch_equal(before[k], after[k])]
    assert moved
    assert {str(v.dtype) for v in after.values()} == {"torch.float32"}


def test_openpi_ema_of_a_sharded_pi0_skips_the_frozen_tower(runs):
    """The same run kept openpi's EMA (decay 0.99) of its FSDP2 shards: pretrained_model_ema/ has every key,
    the frozen SigLIP as it is, and trained weights that are neither the base's nor the live ones (the first
    update copies step 1's weights, the second keeps 0.99 of them: s2 = 0.99 w1 + 0.01 w2)."""
    step = runs["frozen"] / "checkpoints" / "000002"
    live, ema = _weights(step / "pretrained_model"), _weights(step / "pretrained_model_ema")
    assert ema.keys() == live.keys() and {str(v.dtype) for v in ema.values()} == {"torch.float32"}
    assert "kept by each rank of its own shards" in runs["frozen.stdout"]
    vision = [k for k in live if ".vision_tower." in k]
    assert all(torch_equal(live[k], ema[k]) for k in vision)
    base = _weights(runs["single"] / "checkpoints" / "000004" / "pretrained_model")
    moved = [k for k in live if ".gemma_expert.model.layers." in k and not torch_equal(base[k], live[k])]
    assert moved and not any(torch_equal(live[k], ema[k]) or torch_equal(base[k], ema[k]) for k in moved)


def test_lora_with_lerobots_default_pi0_targets_under_fsdp2(runs):
    from safetensors.torch import load_file

    out = runs["lora"]  # the single run's policy fine-tuned with --peft.r=4 on FSDP2 x2, 2 steps
    adapter = load_file(out / "checkpoints" / "000002" / "pretrained_model" / "adapter_model.safetensors")
    targets = {k.split(".lora_")[0] for k in adapter}
    # LeRobot's default pi0 targets: the expert's q/v projections and the five action/state projections.
    assert {t.rsplit(".", 1)[-1] for t in targets} == {
        "q_proj",
        "v_proj",
        "state_proj",
        "action_in_proj",
        "action_out_proj",
        "action_time_mlp_in",
        "action_time_mlp_out",
    }
    assert all(".gemma_expert." in t for t in targets if t.endswith(("q_proj", "v_proj")))
    assert len([t for t in targets if t.endswith("q_proj")]) == 2  # one per expert layer (gemma_tiny: 2)


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


@pytest.fixture(scope="module")
def demo_with_quantiles(tmp_path_factory) -> Path:
    """The demo dataset as tools/make_demo_dataset.py writes it now (same frames as the shipped copy): its
    statistics carry the q01/q99 that pi05 normalises states and actions with; the shipped copy predates
    them."""
    return _load("make_demo_dataset", DEMO_BUILDER).build(tmp_path_factory.mktemp("demo") / "demo_reach")


def test_tiny_pi05_trains_alike_on_one_process_and_fsdp2(runs):
    from safetensors.torch import load_file

    single, fsdp = runs["pi05_single"], runs["pi05_fsdp"]
    reference, got = losses(single), losses(fsdp)
    assert sorted(reference) == sorted(got) == [1, 2, 3]
    for step, loss in reference.items():
        assert abs(got[step] - loss) <= 1e-5 * max(1.0, abs(loss)), (step, got[step], loss)
    saved = fsdp / "checkpoints" / "000003" / "pretrained_model"
    config = json.loads((saved / "config.json").read_text())
    assert config["type"] == "pi05" and config["normalization_mapping"]["STATE"] == "QUANTILES"
    weights = load_file(saved / "model.safetensors")
    assert "model.time_mlp_in.weight" in weights and "model.state_proj.weight" not in weights
    assert "model.paligemma_with_expert.gemma_expert.model.norm.dense.weight" in weights
    steps = [
        s["registry_name"] for s in json.loads((saved / "policy_preprocessor.json").read_text())["steps"]
    ]
    assert "pi05_prepare_state_tokenizer_processor_step" in steps
