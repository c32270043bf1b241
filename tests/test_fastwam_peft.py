"""LoRA on FastWAM's action expert through the real ``lerobot-train``: one process and FSDP2 x2.

A tiny FastWAM base (the guide's demo flags, 2 steps) is saved; LoRA with the spec's default targets (the
action blocks' attention and FFN linears, ``FastWAMConfig.spec.peft_targets``) then trains 3 steps from it on
one process (B=4) and on FSDP2 x2 (B=2 per rank): the adapters sit on the action expert only, the base stays
frozen, both layouts log the same losses (each sample's draws follow its dataset index; the FSDP2 run's
task contexts precomputed, so no rank holds its UMT5), and the saved adapter directory loads back as base +
adapter. Two launches (~40 s on 2 CPU cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastwam_flags import DEMO_FASTWAM

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TINY = DEMO_FASTWAM
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def _losses(run: Path) -> dict[int, float]:
    rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in rows}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch) -> dict[str, Path | str]:
    root = tmp_path_factory.mktemp("fastwam_peft")
    base, single, fsdp = root / "base", root / "lora_single", root / "lora_fsdp"
    lora = [
        f"--policy.path={base / 'checkpoints' / '000002' / 'pretrained_model'}",
        f"--dataset.root={REPO / 'data/lerobot/demo_reach'}",
        "--dataset.repo_id=lerobot/demo_reach",
        "--num_workers=0",
        "--peft.method_type=LORA",
        "--peft.r=4",
        "--optimizer.lr=1e-2",
        "--steps=3",
        "--log_freq=1",
        "--save_freq=3",
    ]
    printed = launch.lerobot_train_runs(
        [*TINY, "--steps=2", "--save_freq=2", "--batch_size=4", f"--output_dir={base}"],
        [*lora, "--batch_size=4", f"--output_dir={single}"],
        nproc=1,
        env=OFFLINE,
    )
    (fsdp_out,) = launch.lerobot_train_runs(
        # the base's contexts precomputed (the PEFT wrapper's policy gets them): the same losses
        [
            *lora,
            "--batch_size=2",
            "--parallelism.dp_shard=2",
            "--policy.precompute_task_contexts=true",
            f"--output_dir={fsdp}",
        ],
        nproc=2,
        env=OFFLINE,
    )
    return {
        "base": base,
        "single": single,
        "fsdp": fsdp,
        "single.stdout": printed[1].stdout,
        "fsdp.stdout": fsdp_out.stdout,
    }


def test_lora_sits_on_the_action_expert_only_and_the_base_stays_frozen(runs):
    import torch
    from safetensors.torch import load_file

    assert "PEFT: LORA r=4" in runs["single.stdout"]
    adapter = load_file(
        runs["single"] / "checkpoints" / "000003" / "pretrained_model" / "adapter_model.safetensors"
    )
    assert adapter and all(".blocks.action." in k and "lora_" in k for k in adapter), sorted(adapter)[:5]
    targets = {k.split(".blocks.action.")[1].rsplit(".lora_", 1)[0] for k in adapter}
    assert targets == {f"{a}.{p}" for a in ("self_attn", "cross_attn") for p in "qkvo"} | {"ffn.0", "ffn.2"}
    # LoRA's B starts at zero: after 3 steps every B has moved, so every adapter trained
    assert all(torch.count_nonzero(v) > 0 for k, v in adapter.items() if "lora_B" in k)
    # the base checkpoint holds no adapter and the run saved no full weights
    saved = runs["single"] / "checkpoints" / "000003" / "pretrained_model"
    assert not (saved / "model.safetensors").exists()


def test_lora_losses_agree_on_one_process_and_fsdp2(runs):
    single, fsdp = _losses(runs["single"]), _losses(runs["fsdp"])
    assert sorted(single) == sorted(fsdp) == [1, 2, 3]
    for step, value in single.items():
        assert abs(fsdp[step] - value) <= 1e-5 * max(1.0, abs(value)), (step, value, fsdp[step])
    assert "dp_shard=2" in runs["fsdp.stdout"]
    assert "is held by 0 of 2 rank(s) while training" in runs["fsdp.stdout"]


def test_the_adapter_directory_loads_as_base_plus_adapter(runs):
    import torch
    from lerobot_cli.policies.pretrained import load_pretrained
    from safetensors.torch import load_file

    saved = runs["fsdp"] / "checkpoints" / "000003" / "pretrained_model"
    _, model = load_pretrained(saved)
    assert type(model).__name__ == "PeftModel"
    base = load_file(runs["base"] / "checkpoints" / "000002" / "pretrained_model" / "model.safetensors")
    adapter = load_file(saved / "adapter_model.safetensors")
    state = model.state_dict()
    loaded = {k: v for k, v in state.items() if "lora_" in k}
    assert len(loaded) == len(adapter) == 40
    assert all(torch.equal(v, adapter[k.replace(".default", "")]) for k, v in loaded.items())
    # the frozen base's weights are the base checkpoint's, bit for bit
    plain = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in state.items()}
    assert all(torch.equal(base[k], plain[k]) for k in base)
