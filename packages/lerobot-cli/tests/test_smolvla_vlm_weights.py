"""``--policy.load_vlm_weights=true``: the VLM starts from its pretrained weights in bf16, as LeRobot 0.6.1's
``from_pretrained(torch_dtype=bfloat16)`` leaves it (policies/smolvla/vlm_weights.py).

On the tiny SmolVLM of smolvlm_tiny.py with seeded fp32 weights (one file, or shards with an index): the
built policy's VLM tensors are the file's, rounded to bf16, for its first ``num_vlm_layers`` text layers
only; the dtypes are LeRobot's (VLM and expert bf16, the expert's cross k/v and the projections fp32); a
shard the truncated VLM does not need is never opened; hostile or missing files end in one line; a
checkpoint (``--policy.path``) loads without the VLM's weights; and a short training run works.
tools/interop/smolvla_lerobot_interop.py compares the result with LeRobot's own, bit for bit.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.smolvla.config import SmolVLAConfig
from lerobot_cli.policies.smolvla.vlm_weights import VLMWeightsError
from lerobot_cli.policies.weights import build_policy, load_policy, save_pretrained

HERE = Path(__file__).resolve().parent
DEMO = HERE.parents[2] / "data" / "lerobot" / "demo_reach"
VLM = "model.vlm_with_expert.vlm."
EXPERT = "model.vlm_with_expert.lm_expert."
FEATURES = {
    "input_features": {
        "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 48, 64)),
        "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
    },
    "output_features": {"action": PolicyFeature(FeatureType.ACTION, (6,))},
}
# 2 of the tiny SmolVLM's 4 text layers: the file's layers 2 and 3 are not the policy's
TINY = {"num_vlm_layers": 2, "chunk_size": 4, "n_action_steps": 4, "resize_imgs_with_padding": (32, 32)}


def _tiny_module():
    spec = importlib.util.spec_from_file_location("smolvlm_tiny", HERE / "smolvlm_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_vlm_with_weights(directory: Path, shards: int = 1) -> tuple[Path, dict]:
    tiny = _tiny_module()
    directory = tiny.save_tiny_smolvlm(directory)
    return directory, tiny.save_tiny_smolvlm_weights(directory, seed=3, shards=shards)


def config(vlm: Path, **overrides) -> SmolVLAConfig:
    return SmolVLAConfig(
        **{**FEATURES, **TINY, "vlm_model_name": str(vlm), "load_vlm_weights": True, **overrides}
    )


@pytest.fixture(scope="module")
def weighted(tmp_path_factory) -> tuple[Path, dict]:
    return tiny_vlm_with_weights(tmp_path_factory.mktemp("tiny_smolvlm_weights"))


def _check_built(policy, state: dict) -> None:
    own = policy.state_dict()
    vlm = {k.removeprefix(VLM): v for k, v in own.items() if k.startswith(VLM)}
    kept = {k for k in state if not any(f"text_model.layers.{i}." in k for i in (2, 3))}
    assert set(vlm) == kept  # the first 2 text layers, everything else of the VLM
    for key, value in vlm.items():
        assert value.dtype == torch.bfloat16, key
        assert torch.equal(value, state[key].to(torch.bfloat16)), key  # the file's, rounded as LeRobot's


def test_the_vlm_is_the_files_in_bf16_and_the_dtypes_are_lerobots(weighted):
    directory, state = weighted
    policy = build_policy(config(directory))
    _check_built(policy, state)
    dtypes = {k: v.dtype for k, v in policy.state_dict().items()}
    cross = {f"{EXPERT}layers.1.self_attn.{p}_proj.{w}" for p in "kv" for w in ("weight",)}
    for key, dtype in dtypes.items():
        if key.startswith(VLM) or (key.startswith(EXPERT) and key not in cross):
            assert dtype == torch.bfloat16, key
        else:  # LeRobot's replaced cross-attention k/v (self_attn_every_n_layers=2: layer 1) and projections
            assert dtype == torch.float32, key
    assert policy.model.vlm_with_expert.vlm.model.text_model.rotary_emb.inv_freq.dtype == torch.float32
    # without the flag: the same tensors, fp32 and random
    fresh = build_policy(config(directory, load_vlm_weights=False)).state_dict()
    assert all(v.dtype == torch.float32 for v in fresh.values())
    assert fresh.keys() == dtypes.keys()


def test_building_the_vlm_draws_nothing_from_the_global_rng(weighted):
    """LeRobot's from_pretrained draws nothing, so the expert's and the projections' random init that
    follows is seed for seed LeRobot's (the interop compares them); the VLM is built bf16."""
    from lerobot_cli.policies.smolvla.vlm import load_vlm_config
    from lerobot_cli.policies.smolvla.vlm_weights import pretrained_build, pretrained_vlm_config
    from transformers import SmolVLMForConditionalGeneration

    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    with pretrained_build():
        vlm = SmolVLMForConditionalGeneration(pretrained_vlm_config(load_vlm_config(str(weighted[0]))))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert {p.dtype for p in vlm.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32


def test_sharded_weights_load_the_same_and_unneeded_shards_are_never_opened(weighted, tmp_path):
    directory, state = tiny_vlm_with_weights(tmp_path / "sharded", shards=3)
    assert not (directory / "model.safetensors").exists()
    _check_built(build_policy(config(directory)), state)
    # layers 2 and 3 moved to a shard of their own, which is garbage: never opened, the load works
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    for key in index["weight_map"]:
        if any(f"text_model.layers.{i}." in key for i in (2, 3)):
            index["weight_map"][key] = "unused.safetensors"
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "unused.safetensors").write_bytes(b"not a safetensors file")
    _check_built(build_policy(config(directory)), state)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    assert "--policy.load_vlm_weights=true" in message
    return message


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors", ""])
def test_a_hostile_index_is_refused_in_one_line(weighted, tmp_path, shard):
    directory = tmp_path / "hostile"
    shutil.copytree(weighted[0], directory)
    (directory / "model.safetensors").unlink()
    keys = list(weighted[1])
    index = {"weight_map": {k: shard if i == 0 else "model-a.safetensors" for i, k in enumerate(keys)}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(VLMWeightsError) as exc:
        build_policy(config(directory))
    assert "refused" in _one_line(exc)


def test_a_shard_symlinked_out_of_the_directory_is_refused(weighted, tmp_path):
    directory = tmp_path / "linked"
    shutil.copytree(weighted[0], directory)
    (directory / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    (directory / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    with pytest.raises(VLMWeightsError) as exc:
        build_policy(config(directory))
    assert "symlink" in _one_line(exc)


def test_missing_or_incomplete_weights_say_so_in_one_line(weighted, tmp_path):
    directory = _tiny_module().save_tiny_smolvlm(tmp_path / "config_only")
    with pytest.raises(VLMWeightsError) as exc:
        build_policy(config(directory))
    assert "has no model.safetensors" in _one_line(exc) and "copy the model's" in str(exc.value)
    (source,) = [s for s in config(directory).external_sources() if s.flag == "--policy.load_vlm_weights"]
    with pytest.raises(VLMWeightsError, match="has no model.safetensors"):  # the CLI's start-up check
        source.resolve()
    from safetensors.torch import save_file

    state = dict(weighted[1])
    del state["model.connector.modality_projection.proj.weight"]
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(VLMWeightsError) as exc:
        build_policy(config(directory))
    assert "lacks 1 of the VLM's" in _one_line(exc) and "modality_projection" in str(exc.value)
    (directory / "model.safetensors").write_bytes(b"\x00" * 7)
    with pytest.raises(VLMWeightsError) as exc:
        build_policy(config(directory))
    assert "not a readable safetensors file" in _one_line(exc)


def test_a_checkpoint_loads_without_the_vlm_weights_in_their_dtypes(weighted, tmp_path):
    """--policy.path: the checkpoint holds every tensor (a strict load), so the VLM's weights are not read
    and need not exist; the built dtypes (bf16 VLM) are what the checkpoint's values land in."""
    directory = tmp_path / "vlm"
    shutil.copytree(weighted[0], directory)
    cfg = config(directory)
    torch.manual_seed(0)
    policy = build_policy(cfg)
    with torch.no_grad():  # values no VLM file has: the checkpoint's must win
        for param in policy.parameters():
            param.add_(0.5)
    saved = save_pretrained(policy, cfg, tmp_path / "pretrained_model")
    assert json.loads((saved / "config.json").read_text())["load_vlm_weights"] is True
    (directory / "model.safetensors").unlink()  # the VLM's weights are gone
    assert not cfg.pretrained_path and "--policy.load_vlm_weights" in [s.flag for s in cfg.external_sources()]
    _, loaded = load_policy(saved)
    want, got = policy.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
    import attrs

    fine_tune = attrs.evolve(cfg, pretrained_path=str(saved))
    assert fine_tune.initial_weights() is None
    assert [s.flag for s in fine_tune.external_sources()] == ["--policy.vlm_model_name"]


def test_a_short_training_run_starts_from_the_vlm_weights_and_resumes_without_them(
    weighted, tmp_path, monkeypatch, capsys
):
    from lerobot_cli.train import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    directory, state = tmp_path / "vlm", weighted[1]
    shutil.copytree(weighted[0], directory)
    out = tmp_path / "run"
    argv = [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--policy.type=smolvla",
        f"--policy.vlm_model_name={directory}",
        "--policy.load_vlm_weights=true",
        "--policy.num_vlm_layers=2",
        "--policy.chunk_size=4",
        "--policy.n_action_steps=4",
        "--policy.resize_imgs_with_padding=[32,32]",
        "--steps=3",
        "--batch_size=4",
        "--log_freq=1",
        "--save_freq=2",
        "--num_workers=0",
        f"--output_dir={out}",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Initial weights: the VLM's from" in printed, printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(torch.isfinite(torch.tensor(row["loss"])) for row in rows)
    saved = out / "checkpoints" / "last" / "pretrained_model"
    assert json.loads((saved / "config.json").read_text())["load_vlm_weights"] is True
    _, policy = load_policy(saved)
    # the frozen VLM (train_expert_only) is still the file's, in bf16
    vlm = {k.removeprefix(VLM): v for k, v in policy.state_dict().items() if k.startswith(VLM)}
    assert all(torch.equal(v, state[k].to(torch.bfloat16)) for k, v in vlm.items())
    # a resume from step 2 takes every tensor from its checkpoint: the VLM's weights need not be there
    (directory / "model.safetensors").unlink()
    resumed = tmp_path / "resumed"
    resume = [
        "--resume=true",
        f"--config_path={out / 'checkpoints' / '000002'}",
        f"--output_dir={resumed}",
    ]
    assert main(resume) == 0
    again = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again] == [3] and again[0]["loss"] == rows[2]["loss"]


def test_a_missing_weight_set_ends_the_cli_in_one_line(tmp_path, monkeypatch, capsys):
    from lerobot_cli.train import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    directory = _tiny_module().save_tiny_smolvlm(tmp_path / "config_only")
    argv = [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--policy.type=smolvla",
        f"--policy.vlm_model_name={directory}",
        "--policy.load_vlm_weights=true",
        "--steps=1",
        f"--output_dir={tmp_path / 'run'}",
    ]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "has no model.safetensors" in err[0] and "--policy.load_vlm_weights=true" in err[0]
    ), err


def test_a_hub_id_without_its_weights_names_the_download(weighted, tmp_path, monkeypatch):
    """A Hub id whose config.json (and tokenizer) are cached but not its weights: `hf download <name>`."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--someone--tiny-smolvlm"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(weighted[0] / name, snapshot / name)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(VLMWeightsError) as exc:
        build_policy(config("someone/tiny-smolvlm"))
    assert "`hf download someone/tiny-smolvlm`" in _one_line(exc)
    # in the cache's layout, the snapshot's files are links into blobs/: read
    blob = repo / "blobs" / "weights"
    blob.parent.mkdir()
    shutil.copy(weighted[0] / "model.safetensors", blob)
    (snapshot / "model.safetensors").symlink_to(Path("..", "..", "blobs", "weights"))
    _check_built(build_policy(config("someone/tiny-smolvlm")), weighted[1])


def test_the_single_file_wins_over_an_index_as_in_transformers(weighted, tmp_path):
    """from_pretrained reads model.safetensors when there is one, whatever index lies beside it."""
    directory = tmp_path / "both"
    shutil.copytree(weighted[0], directory)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../x"}}))
    _check_built(build_policy(config(directory)), weighted[1])
