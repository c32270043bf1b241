"""LoRA (peft) on ACT through the real ``lerobot-train`` path, on 1 process, DDP 2, FSDP2 2 and HSDP 2×2.

One chain of launches (``multiproc/peft_run.py`` runs the product's runner and then inspects the
live model) on a tiny ACT base saved as a pretrained policy: LoRA runs on 1 process (B=4), DDP 2 and FSDP2
2 (B=2) train 3 steps on the same global batch; HSDP 2×2 (B=1) resumes the FSDP2 run's step-2
``dcp`` checkpoint and trains step 3; FSDP2 trains a bf16 base under bf16 mixed precision. The base
has no VAE, no dropout and 1-step chunks (nothing padded), so the reduced losses must agree. The x2
runs (DDP, FSDP2, the bf16 base) share one launch of peft_run.py, one after another.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "multiproc" / "peft_run.py"
REPO = HERE.parent
BIN = Path(sys.executable).parent
DATA = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={REPO / 'data/lerobot/demo_reach'}",
    "--num_workers=0",
    "--log_freq=1",
]
BASE_ACT = {
    "pretrained_backbone_weights": None,
    "dim_model": 32,
    "dim_feedforward": 64,
    "n_heads": 2,
    "n_encoder_layers": 1,
    "n_decoder_layers": 1,
    "chunk_size": 1,
    "n_action_steps": 1,
    "use_vae": False,
    "dropout": 0.0,
}
LORA = ["--peft.r=4", '--peft.full_training_modules=["action_head"]', "--optimizer.lr=1e-3", "--steps=3"]
TOL = 1e-5


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _losses(run_dir: Path) -> dict[int, float]:
    return {
        r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    }


def _run_many(
    launch, *runs: tuple[Path, Path, tuple[str, ...]], nproc: int = 1, timeout_s: float = 300
) -> list[SimpleNamespace]:
    """``(out, base, flags)`` runs one after another in ONE launch of peft_run.py (start-up paid once)."""
    args: list[str] = []
    for out, base, flags in runs:
        out.mkdir(parents=True, exist_ok=True)
        args += [
            str(out),
            str(base),
            *DATA,
            f"--policy.path={base}",
            *flags,
            f"--output_dir={out / 'run'}",
            "--then",
        ]
    job = (
        launch.torchrun(SCRIPT, *args, nproc=nproc, timeout_s=timeout_s)
        if nproc > 1
        else launch.run_command([sys.executable, str(SCRIPT), *args], timeout_s=timeout_s)
    )
    assert job.returncode == 0 and not job.timed_out, job.describe()
    return [
        SimpleNamespace(
            out=out,
            run=out / "run",
            losses=_losses(out / "run"),
            ranks=[json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)],
            adapter=_tensors(out / "final_adapter.safetensors"),
        )
        for out, _, _ in runs
    ]


def _run(
    launch, out: Path, base: Path, *flags: str, nproc: int = 1, timeout_s: float = 300
) -> SimpleNamespace:
    return _run_many(launch, (out, base, flags), nproc=nproc, timeout_s=timeout_s)[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny ACT for the demo data, saved as a pretrained policy (LoRA needs a base, not its training)."""
    import torch
    from lerobot_cli.datasets import load_meta
    from lerobot_cli.policies.act.config import ACTConfig
    from lerobot_cli.policies.act.modeling import ACTPolicy
    from lerobot_cli.policies.pretrained import save_pretrained
    from lerobot_cli.workload import policy_config_for_dataset

    config = policy_config_for_dataset(
        ACTConfig(**BASE_ACT), load_meta(REPO / "data/lerobot/demo_reach").features
    )
    torch.manual_seed(0)
    return save_pretrained(
        ACTPolicy(config), config, tmp_path_factory.mktemp("peft_base") / "pretrained_model"
    )


@pytest.fixture(scope="module")
def bf16_base(base, tmp_path_factory) -> Path:
    """``base`` with its floating-point weights stored in bf16."""
    import torch
    from safetensors.torch import save_file

    bf16 = tmp_path_factory.mktemp("peft_bf16") / "bf16_base"
    shutil.copytree(base, bf16)
    weights = _tensors(bf16 / "model.safetensors")
    save_file(
        {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()},
        str(bf16 / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return bf16


@pytest.fixture(scope="module")
def runs(launch, base, bf16_base, tmp_path_factory) -> dict[str, SimpleNamespace]:
    """The x2 runs (DDP, FSDP2 and the bf16 base's FSDP2 run) share one launch."""
    root = tmp_path_factory.mktemp("peft_runs")
    out = {"single": _run(launch, root / "single", base, *LORA, "--batch_size=4")}
    out["ddp"], out["fsdp"], out["bf16"] = _run_many(
        launch,
        (root / "ddp", base, (*LORA, "--batch_size=2")),
        (
            root / "fsdp",
            base,
            (*LORA, "--batch_size=2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp", "--save_freq=2"),
        ),
        (
            root / "bf16",
            bf16_base,
            (
                *LORA[:-1],
                "--steps=2",
                "--batch_size=2",
                "--parallelism.dp_shard=2",
                "--accelerator.mixed_precision=bf16",
                "--save_checkpoint=false",
            ),
        ),
        nproc=2,
        timeout_s=400,
    )
    resumed_from = out["fsdp"].run / "checkpoints" / "000002"
    out["hsdp"] = _run(
        launch,
        root / "hsdp",
        base,
        "--resume=true",
        f"--config_path={resumed_from}",
        "--parallelism.dp_replicate=2",
        "--parallelism.dp_shard=2",
        "--batch_size=1",
        "--checkpoint_format=safetensors_dcp",
        nproc=4,
        timeout_s=400,
    )
    return out


def _ckpt(run: SimpleNamespace, step: int = 3) -> Path:
    return run.run / "checkpoints" / f"{step:06d}" / "pretrained_model"


def test_losses_match_across_topologies_on_the_same_global_batch(runs):
    single = runs["single"].losses
    assert sorted(single) == [1, 2, 3]
    for name in ("ddp", "fsdp"):
        assert all(abs(runs[name].losses[s] - single[s]) < TOL for s in single), (
            name,
            runs[name].losses,
            single,
        )
    # HSDP 2x2 resumed the FSDP2 step-2 checkpoint: its step 3 is the uninterrupted runs' step 3.
    assert list(runs["hsdp"].losses) == [3] and abs(runs["hsdp"].losses[3] - single[3]) < TOL


@pytest.mark.parametrize("name", ["single", "ddp", "fsdp", "hsdp"])
def test_frozen_base_is_bitwise_unchanged_and_adapters_trained(runs, name):
    for report in runs[name].ranks:
        assert report["step"] == 3
        frozen, trainable = report["frozen"], report["trainable"]
        assert frozen and all(v["bitwise_base"] for v in frozen.values()), [
            k for k, v in frozen.items() if not v["bitwise_base"]
        ]
        lora_b = [k for k in trainable if ".lora_B." in k]
        copies = [k for k in trainable if ".modules_to_save." in k]
        assert len(lora_b) == 4 and len(copies) == 2 and len(trainable) == 10, sorted(trainable)
        assert all(trainable[k]["moved"] for k in lora_b + copies)
        assert {v["dtype"] for v in trainable.values()} == {"torch.float32"}
        assert not any(k.startswith("base_model.model.model.backbone") for k in trainable)


@pytest.mark.parametrize(("name", "dp_shard"), [("fsdp", 2), ("hsdp", 2)])
def test_each_rank_holds_only_its_shard_of_the_base(runs, name, dp_shard):
    import torch

    for report in runs[name].ranks:
        assert report["dp_shard"] == dp_shard
        linear = report["shards"]["base_model.model.model.encoder.layers.0.linear1.base_layer.weight"]
        assert linear[0] * dp_shard == linear[1]
        for local, total, shape in report["shards"].values():
            rows = [c.shape[0] for c in torch.empty(shape[0]).chunk(dp_shard)]
            assert local in {r * (total // shape[0]) for r in rows} | {0}


def _adapter_files(ckpt: Path) -> set[str]:
    return {p.name for p in ckpt.iterdir()} & {
        "adapter_model.safetensors",
        "adapter_config.json",
        "model.safetensors",
        "pytorch_model_fsdp_0",
    }


def test_checkpoint_contents_per_format(runs, base):
    from torch.distributed.checkpoint import FileSystemReader

    peft_names = set(runs["single"].adapter)
    for name in ("single", "ddp"):
        ckpt = _ckpt(runs[name])
        assert _adapter_files(ckpt) == {"adapter_model.safetensors", "adapter_config.json"}
        stored = _tensors(ckpt / "adapter_model.safetensors")
        assert stored.keys() == peft_names and all(stored[k].equal(runs[name].adapter[k]) for k in stored)
        config = json.loads((ckpt / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(base) and config["peft_type"] == "LORA"
        assert config["r"] == 4 and config["modules_to_save"] == ["action_head"]
        assert (
            json.loads((ckpt / "config.json").read_text())["use_peft"] is True
        )  # LeRobot's make_policy marker
        optimizer = _tensors(ckpt.parent / "training_state" / "optimizer_state.safetensors")
        assert len({k.split("/")[1] for k in optimizer}) == len(peft_names)  # state for trainable params only
    assert all(k.startswith("base_model.model.") and ".default." not in k for k in peft_names)
    fsdp = _ckpt(runs["fsdp"])
    assert _adapter_files(fsdp) == {"adapter_config.json", "pytorch_model_fsdp_0"}
    shards = FileSystemReader(str(fsdp / "pytorch_model_fsdp_0")).read_metadata().state_dict_metadata
    assert set(shards) == {f"model.{k}" for k in peft_names}  # the adapter only, under peft's names
    optim = (
        FileSystemReader(str(fsdp.parent / "training_state" / "optimizer_0"))
        .read_metadata()
        .state_dict_metadata
    )
    assert {k.split(".", 2)[2].rsplit(".", 1)[0] for k in optim if k.startswith("optimizer.state.")} == {
        k.replace(".lora_A.", ".lora_A.default.")
        .replace(".lora_B.", ".lora_B.default.")
        .replace(".action_head.", ".action_head.modules_to_save.default.")
        for k in peft_names
    }
    record = json.loads((fsdp.parent / "training_state" / "training_step.json").read_text())["artifacts"]
    assert record["peft_adapter"] and record["model_dcp"] and not record["model_safetensors"]
    hsdp = _ckpt(runs["hsdp"])
    assert _adapter_files(hsdp) == {
        "adapter_model.safetensors",
        "adapter_config.json",
        "pytorch_model_fsdp_0",
    }
    stored = _tensors(hsdp / "adapter_model.safetensors")
    assert all(stored[k].equal(runs["hsdp"].adapter[k]) for k in peft_names)


def _actions_of_loaded(ckpt: Path, run: SimpleNamespace):
    import torch
    from lerobot_cli.policies.pretrained import load_pretrained

    _, model = load_pretrained(ckpt)
    batch = _tensors(run.out / "fixed_batch.safetensors")
    expected = batch.pop("actions")
    with torch.no_grad():
        got = model.get_base_model().predict_action_chunk(batch)
    return type(model).__name__, float((got - expected).abs().max())


def test_loaded_adapter_and_base_reproduce_the_trained_model(runs):
    kind, diff = _actions_of_loaded(_ckpt(runs["single"]), runs["single"])
    assert kind == "PeftModel" and diff < TOL


def test_dcp_adapter_needs_conversion_then_loads(runs, launch, tmp_path):
    ckpt = tmp_path / "000003"
    shutil.copytree(_ckpt(runs["fsdp"]).parent, ckpt)
    refused = launch.run_command(
        [
            str(BIN / "lerobot-train"),
            *DATA,
            f"--policy.path={ckpt}",
            "--steps=1",
            f"--output_dir={tmp_path / 'refused'}",
        ],
        timeout_s=120,
    )
    assert refused.returncode == 2 and "convert them first" in refused.stderr, refused.describe()
    assert "Traceback" not in refused.stderr and not (tmp_path / "refused").exists()
    job = launch.run_command([str(BIN / "lerobot-convert-dcp"), f"--checkpoint_dir={ckpt}"], timeout_s=120)
    assert job.returncode == 0, job.describe()
    merged = _tensors(ckpt / "pretrained_model" / "adapter_model.safetensors")
    trained = runs["fsdp"].adapter
    assert merged.keys() == trained.keys() and all(merged[k].equal(trained[k]) for k in merged)
    assert not (ckpt / "pretrained_model" / "model.safetensors").exists()
    kind, diff = _actions_of_loaded(ckpt / "pretrained_model", runs["fsdp"])
    assert kind == "PeftModel" and diff < TOL


def test_bf16_base_under_fsdp2_keeps_its_dtype_and_trains_fp32_adapters(runs):
    run = runs["bf16"]  # the bf16 base, LoRA on FSDP2 x2 under bf16 mixed precision, 2 steps (``runs``)
    for report in run.ranks:
        frozen, trainable = report["frozen"], report["trainable"]
        weights_2d = [k for k in frozen if k.endswith(".weight") and k in report["shards"]]
        assert weights_2d and {frozen[k]["dtype"] for k in weights_2d} == {"torch.bfloat16"}
        assert all(v["bitwise_base"] for v in frozen.values())  # bf16 base == the bf16 file, bit for bit
        assert {v["dtype"] for v in trainable.values()} == {"torch.float32"}
        assert all(v["moved"] for k, v in trainable.items() if ".lora_B." in k or ".modules_to_save." in k)
    assert all(math.isfinite(loss) for loss in run.losses.values()) and sorted(run.losses) == [1, 2]


def _perturbed_copy(src: Path, dst: Path) -> None:
    """Step directory ``src`` copied to ``dst`` with one weight changed: a base that was trained further."""
    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    file = dst / "pretrained_model" / "model.safetensors"
    weights = _tensors(file)
    name = next(k for k, v in weights.items() if v.is_floating_point())
    weights[name] = weights[name] + 1.0
    save_file(weights, str(file), metadata={"format": "pt"})


def test_resume_pins_the_frozen_base_and_refuses_one_that_changed(launch, base, tmp_path):
    import hashlib
    import os

    checkpoints = tmp_path / "base_run" / "checkpoints"  # a base run whose `last` will move on
    shutil.copytree(base, checkpoints / "000001" / "pretrained_model")
    os.symlink("000001", checkpoints / "last")
    pinned = checkpoints / "000001" / "pretrained_model"
    train = [str(BIN / "lerobot-train"), *DATA, *LORA[:-1], "--batch_size=2"]
    out = tmp_path / "lora"
    job = launch.run_command(
        [
            *train,
            f"--policy.path={checkpoints / 'last' / 'pretrained_model'}",
            "--steps=2",
            f"--output_dir={out}",
        ],
        timeout_s=180,
    )
    assert job.returncode == 0, job.describe()
    ckpt = out / "checkpoints" / "000002"
    record = json.loads((ckpt / "training_state" / "training_step.json").read_text())
    digest = hashlib.sha256((pinned / "model.safetensors").read_bytes()).hexdigest()
    assert record["base_model"] == {"reference": str(pinned), "weights_sha256": digest}
    assert json.loads((ckpt / "pretrained_model" / "train_config.json").read_text())["policy"][
        "pretrained_path"
    ] == str(pinned)
    # The base run moves on: `last` now names other weights. The resume keeps training on 000001.
    _perturbed_copy(pinned.parent, checkpoints / "000002")
    os.unlink(checkpoints / "last")
    os.symlink("000002", checkpoints / "last")
    resume = [str(BIN / "lerobot-train"), "--resume=true", f"--config_path={out / 'checkpoints' / 'last'}"]
    job = launch.run_command([*resume, "--steps=3"], timeout_s=180)
    assert job.returncode == 0 and "warning" not in job.stderr, job.describe()
    config = json.loads((out / "checkpoints/000003/pretrained_model/adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(pinned)
    # The pinned base itself is rewritten in place: the adapter's base is gone, so the resume refuses.
    shutil.rmtree(pinned.parent)
    _perturbed_copy(checkpoints / "000002", pinned.parent)
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    job = launch.run_command([*resume, "--steps=4"], timeout_s=180)
    assert job.returncode == 2, job.describe()
    (line,) = job.stderr.strip().splitlines()
    assert "the frozen base policy of this PEFT run changed" in line and f"{digest[:12]}…" in line
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before


def test_a_dry_run_of_lora_on_a_pretrained_policy_reads_no_weights(launch, base):
    """``--dry_run=true --policy.path=<base> --peft.*`` builds the policy and its adapters on the meta
    device from their shapes (it used to try to load the weights there and end in a traceback)."""
    res = launch.run_command(
        [
            launch.LEROBOT_TRAIN,
            "--dataset.repo_id=lerobot/demo_reach",
            f"--dataset.root={REPO / 'data/lerobot/demo_reach'}",
            f"--policy.path={base}",
            "--peft.r=4",
            "--dry_run=true",
        ],
        timeout_s=120,
    )
    assert res.returncode == 0, res.describe()
    assert "Traceback" not in res.stderr and "meta parameter" not in res.stderr
    total, learnable = re.search(r"parameters ([\d,]+) \(learnable ([\d,]+)\)", res.stdout).groups()
    assert 0 < int(learnable.replace(",", "")) < int(total.replace(",", ""))  # the adapters alone
