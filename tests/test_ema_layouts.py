"""EMA through ``lerobot-train`` (a small MLP on the demo dataset): one process and FSDP2 x2 keep the
same shadow (FSDP2: each rank the EMA of its own shards, saved as DCP shards of
``pretrained_model_ema/``); a resume continues it bitwise on the same topology and to 1e-6 on another
one (where the model itself differs by reduction order), from the restored shadow and update count
rather than a restart. Agreement between layouts would also hold for an update that did nothing, so
every run's shadow is also replayed from the weights it saved after each update (``ema_replay.py``).
``lerobot-convert-dcp`` converts the EMA shards too; ``--policy.path`` loads ``pretrained_model_ema/``;
a PEFT run under FSDP2 averages the adapters only (and the fully trained head), written in both
formats. The held-out eval loss (with the EMA weights) is the same under one process, DDP x2 and
FSDP2 x2, and an eval leaves FSDP2 training bitwise as it was. Four launches.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")

pytestmark = pytest.mark.slow

DATA = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--ema.enable=true",
    "--log_freq=3",
]
MLP = [
    *DATA,
    "--policy.type=mlp",
    "--policy.hidden_dim=32",
    "--steps=6",
    "--save_freq=3",
    "--dataset.eval_split=0.2",
    "--eval_steps=3",
]
FSDP = ["--parallelism.dp_shard=2", "--batch_size=4", "--checkpoint_format=dcp"]
EVERY_STEP = "--save_freq=1"  # (the last --save_freq given wins)


def _ema_replay():
    """tests/ema_replay.py: the shadow recomputed from the recorded weights of each update."""
    spec = importlib.util.spec_from_file_location(
        "lerobot_tests_ema_replay", Path(__file__).parent / "ema_replay.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(launch, *args: str, nproc: int = 1):
    res = (
        launch.run_command([SCRIPT, *args], timeout_s=180)
        if nproc == 1
        else launch.torchrun(SCRIPT, *args, nproc=nproc, timeout_s=240)
    )
    assert not res.timed_out and res.returncode == 0, res.describe()
    return res


def tensors(path: Path):
    from safetensors.torch import load_file

    return load_file(str(path))


def resumable_copy(run: Path, dst: Path, step: int) -> Path:
    """``run`` copied with its checkpoints after ``step`` removed (``last`` pointing at ``step``)."""
    shutil.copytree(run, dst, symlinks=True)
    ckpts = dst / "checkpoints"
    for d in ckpts.iterdir():
        if d.name.isdigit() and int(d.name) > step:
            shutil.rmtree(d)
    (ckpts / "last").unlink()
    (ckpts / "last").symlink_to(f"{step:06d}")
    (dst / "metrics.jsonl").write_text(
        "".join(
            ln + "\n"
            for ln in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(ln)["step"] <= step
        )
    )
    return ckpts / f"{step:06d}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch):
    from lerobot_ckpt.convert.merge import convert_dcp

    root = tmp_path_factory.mktemp("ema")
    single, fsdp = root / "single", root / "fsdp"
    # every run that keeps an EMA saves after each update: the weights the shadow is replayed from
    res_single = train(launch, *MLP, "--batch_size=8", EVERY_STEP, f"--output_dir={single}")
    ddp, quiet, evaluated = root / "ddp", root / "fsdp_no_eval", root / "fsdp_eval"
    res_fsdp, _, _, _ = launch.lerobot_train_runs(
        # written in the background: the EMA shards' snapshot writers (what the resumes below read)
        [*MLP, *FSDP, "--checkpoint_async=true", EVERY_STEP, f"--output_dir={fsdp}"],
        [*MLP, "--batch_size=4", "--save_checkpoint=false", f"--output_dir={ddp}"],
        # no checkpoint after the eval (a save's state-dict pass would hide what the eval leaves gathered)
        # the same held-out split, never evaluated in these 6 steps (--eval_steps=0 with a split is refused)
        [
            *MLP,
            *FSDP,
            "--save_checkpoint=false",
            "--eval_steps=1000",
            "--log_freq=1",
            f"--output_dir={quiet}",
        ],
        [*MLP, *FSDP, "--save_checkpoint=false", "--log_freq=1", f"--output_dir={evaluated}"],
        nproc=2,
    )
    same = resumable_copy(fsdp, root / "same", 3)
    other = resumable_copy(fsdp, root / "other", 3)
    base = single / "checkpoints" / "000006" / "pretrained_model"
    peft = root / "peft"
    res_same, res_peft = launch.lerobot_train_runs(
        ["--resume=true", f"--config_path={same}"],
        [
            *DATA,
            "--steps=3",
            "--save_freq=3",
            "--parallelism.dp_shard=2",
            "--batch_size=4",
            "--checkpoint_format=safetensors_dcp",
            f"--policy.path={base}",
            "--peft.r=4",
            '--peft.full_training_modules=["action_head"]',
            "--optimizer.lr=1e-2",
            f"--output_dir={peft}",
        ],
        nproc=2,
    )
    res_other = train(
        launch, "--resume=true", f"--config_path={other}", "--batch_size=8", "--parallelism.dp_shard=1"
    )
    converted = {
        name: convert_dcp(run / "checkpoints" / "000006")
        for name, run in (("fsdp", fsdp), ("same", root / "same"))
    }
    return {
        "root": root,
        "single": single,
        "fsdp": fsdp,
        "ddp": ddp,
        "quiet": quiet,
        "evaluated": evaluated,
        "same": root / "same",
        "other": root / "other",
        "peft": peft,
        "stdout": {"single": res_single.stdout, "fsdp": res_fsdp.stdout, "peft": res_peft.stdout},
        "stderr": {"same": res_same.stderr, "other": res_other.stderr},
        "converted": converted,
    }


def ema_file(run: Path, step: int = 6) -> Path:
    return run / "checkpoints" / f"{step:06d}" / "pretrained_model_ema" / "model.safetensors"


def live_file(run: Path, step: int = 6) -> Path:
    return run / "checkpoints" / f"{step:06d}" / "pretrained_model" / "model.safetensors"


def test_each_shadow_is_the_ema_of_the_weights_its_run_recorded(runs):
    """One process and FSDP2 x2 (its shards' EMA, gathered into pretrained_model_ema/), and both resumes of
    the FSDP2 run's step 3 (same topology, and one process): at every step the shadow is the update of the
    step before's shadow by that step's live weights, bitwise (tests/ema_replay.py), so the updates happen,
    with the scheduled decay, and a resume continues from the restored shadow and count."""
    replay = _ema_replay().assert_ema_replays
    for name in ("single", "fsdp", "same", "other"):
        replay(runs[name], list(range(1, 7)))


def test_banner_says_where_the_shadow_lives(runs):
    assert "EMA: decay 1-(1+t/1.0)^-0.75 in [0.0, 0.9999]; kept by this process" in runs["stdout"]["single"]
    assert "kept by each rank of its own shards; saved as pretrained_model_ema/" in runs["stdout"]["fsdp"]
    assert "000003 (writing in the background)" in runs["stdout"]["fsdp"]  # the async save path


def test_sharded_shadow_equals_the_unsharded_one(runs):
    import torch

    fsdp = runs["fsdp"] / "checkpoints" / "000006"
    record = json.loads((fsdp / "training_state" / "training_step.json").read_text())
    assert record["artifacts"]["ema_dcp"] and record["loop"]["ema_updates"] == 6
    assert (fsdp / "pretrained_model_ema" / "pytorch_model_fsdp_0").is_dir()  # each rank wrote its shards
    assert runs["converted"]["fsdp"].ema is not None  # lerobot-convert-dcp converted the EMA shards too
    assert json.loads((fsdp / "training_state" / "training_step.json").read_text())["artifacts"][
        "ema_safetensors"
    ]
    ref, got = tensors(ema_file(runs["single"])), tensors(ema_file(runs["fsdp"]))
    live = tensors(live_file(runs["single"]))
    assert set(ref) == set(got) == set(live)
    for k in ref:
        assert torch.allclose(got[k], ref[k], atol=1e-6, rtol=0), (k, (got[k] - ref[k]).abs().max())
    # and the shadow is not the live weights (6 updates of the warmup schedule average several steps)
    assert max((ref[k] - live[k]).abs().max().item() for k in ref if k.endswith("weight")) > 1e-4


def test_same_topology_resume_continues_the_shadow_bitwise(runs):
    import torch

    assert "EMA" not in runs["stderr"]["same"]  # restored, so nothing to warn about
    for name in (live_file, ema_file):
        a, b = tensors(name(runs["fsdp"])), tensors(name(runs["same"]))
        assert all(torch.equal(a[k], b[k]) for k in a), name.__name__


def test_other_topology_resume_continues_the_restored_shadow(runs):
    """FSDP2 x2 (DCP shards) -> one process: the shadow is read from the shards into whole tensors and
    continues; a restarted one would equal the live weights of step 4 onwards (decay 0 at its first
    update)."""
    import torch

    assert "EMA" not in runs["stderr"]["other"]
    other = runs["other"] / "checkpoints" / "000006"
    record = json.loads((other / "training_state" / "training_step.json").read_text())
    assert record["loop"]["ema_updates"] == 6 and record["artifacts"]["ema_safetensors"]
    ref, got = tensors(ema_file(runs["single"])), tensors(ema_file(runs["other"]))
    for k in ref:
        assert torch.allclose(got[k], ref[k], atol=1e-6, rtol=0), (k, (got[k] - ref[k]).abs().max())


def test_policy_path_loads_the_ema_weights(runs):
    import torch
    from lerobot_cli.policies.pretrained import load_pretrained

    directory = runs["single"] / "checkpoints" / "000006" / "pretrained_model_ema"
    cfg, policy = load_pretrained(directory)
    assert cfg.type == "mlp"
    expected = tensors(directory / "model.safetensors")
    state = policy.state_dict()
    assert all(torch.equal(state[k], expected[k]) for k in expected)


def test_peft_shadow_covers_the_adapters_only(runs):
    import torch
    from lerobot_cli.policies.pretrained import load_pretrained

    step = runs["peft"] / "checkpoints" / "000003"
    live = tensors(step / "pretrained_model" / "adapter_model.safetensors")
    ema = tensors(step / "pretrained_model_ema" / "adapter_model.safetensors")
    assert set(ema) == set(live) and any("lora_A" in k for k in ema) and any("action_head" in k for k in ema)
    assert not (step / "pretrained_model_ema" / "model.safetensors").exists()  # never the frozen base
    assert (step / "pretrained_model_ema" / "pytorch_model_fsdp_0").is_dir()
    assert (step / "pretrained_model_ema" / "adapter_config.json").is_file()
    assert max((ema[k] - live[k]).abs().max().item() for k in ema) > 1e-5  # averaged, not a copy
    assert "EMA: " in runs["stdout"]["peft"]
    _, policy = load_pretrained(
        step / "pretrained_model_ema"
    )  # base + the EMA adapter, as --policy.path does
    lora = {k.replace(".default", ""): v for k, v in policy.state_dict().items() if "lora_" in k}
    assert set(lora) == {k for k in ema if "lora_" in k}
    assert all(torch.equal(v, ema[k]) for k, v in lora.items())


def eval_losses(run: Path) -> dict[int, float]:
    return {
        r["step"]: r["eval/loss"]
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "eval/loss" in r
    }


def test_eval_loss_is_the_same_on_every_layout(runs):
    assert "Eval: 6 of 30 episodes held out" in runs["stdout"]["single"]
    assert "on 317 frames with the EMA weights" in runs["stdout"]["fsdp"]
    ref = eval_losses(runs["single"])
    assert sorted(ref) == [3, 6] and ref[6] < ref[3]
    for name in ("ddp", "fsdp"):
        got = eval_losses(runs[name])
        assert sorted(got) == [3, 6], name
        for step, value in ref.items():
            # the weights differ by float summation order only (~1e-7); the eval sums weigh each sample alike
            assert abs(got[step] - value) <= 1e-6 * max(1.0, abs(value)), (name, step, got[step], value)


def test_an_eval_with_the_ema_weights_leaves_fsdp2_training_bitwise_unchanged(runs):
    """FSDP2 keeps the root's parameters gathered after a forward (and a backward normally follows); an
    eval forward with the EMA swapped in must not leave them for the next training step."""

    def train_losses(run):
        return {
            r["step"]: r["loss"]
            for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r
        }

    assert sorted(eval_losses(runs["evaluated"])) == [3, 6] and not eval_losses(runs["quiet"])
    assert train_losses(runs["evaluated"]) == train_losses(runs["quiet"])  # every step, bitwise


def test_sharded_shadow_loads_bitwise_into_one_process(runs, tmp_path):
    """The FSDP2 run's step-3 EMA shards (DCP) read into a one-process policy's shadow are exactly the
    merged file lerobot-convert-dcp makes of them: the restore of a resume on another topology."""
    import shutil as sh

    import torch
    from lerobot_ckpt import TrainingObjects, load_checkpoint
    from lerobot_ckpt.convert.merge import convert_dcp
    from lerobot_cli.policies.pretrained import build_policy
    from lerobot_cli.policies.serialization import load_policy_config
    from lerobot_trainloop import EmaConfig, ModelEma

    step = tmp_path / "000003"
    sh.copytree(runs["fsdp"] / "checkpoints" / "000003", step)
    policy = build_policy(
        load_policy_config(step / "pretrained_model" / "config.json")
    ).train()  # fresh weights
    ema = ModelEma(policy, EmaConfig(enable=True))
    state = load_checkpoint(step, objects=TrainingObjects(model=policy, ema=ema.state()), restore_rng=False)
    assert state.ema_restored
    convert_dcp(step)  # both pretrained_model/ and pretrained_model_ema/ merged from their shards
    merged = tensors(step / "pretrained_model_ema" / "model.safetensors")
    assert all(torch.equal(v, merged[k]) for k, v in ema.state().items())
    assert not all(
        torch.equal(v, tensors(step / "pretrained_model" / "model.safetensors")[k])
        for k, v in ema.state().items()
    )
