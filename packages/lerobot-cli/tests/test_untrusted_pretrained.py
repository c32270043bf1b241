"""A pretrained directory someone sent (``--policy.path``) is read only inside itself, and every field
read from it is checked: each refusal a ``ValueError`` of one line naming the file and the entry.

Library level, in-process; ``tests/test_untrusted_policy_path.py`` runs the same crafted files
through ``lerobot-train``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from lerobot_ckpt.paths import UnsafePathError
from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.location import links_root
from lerobot_cli.processors import load_processors, make_pre_post_processors, save_processors

STATE = "policy_preprocessor_step_3_normalizer_processor.safetensors"
PRE = "policy_preprocessor.json"


def _processors(directory: Path) -> Path:
    config = ACTConfig(
        input_features={"observation.state": PolicyFeature("STATE", (3,))},
        output_features={"action": PolicyFeature("ACTION", (2,))},
    )
    stats = {
        "observation.state": {"mean": [1.0, 2.0, 3.0], "std": [2.0, 4.0, 0.5]},
        "action": {"mean": [0.5, -1.0], "std": [2.0, 0.25]},
    }
    pre, post = make_pre_post_processors(config, stats)
    directory.mkdir(parents=True, exist_ok=True)
    save_processors(pre, post, directory)
    return directory


def _set_state_file(directory: Path, value: str) -> None:
    file = directory / PRE
    data = json.loads(file.read_text())
    data["steps"][3]["state_file"] = value
    file.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "crafted, why",
    [
        ("{outside}/" + STATE, "is an absolute path"),
        ("../outside/" + STATE, "is not a plain relative path"),
        ("sub/../" + STATE, "is not a plain relative path"),
        ("link.safetensors", "is a symlink"),
    ],
    ids=["absolute", "dotdot", "inner-dotdot", "symlink-out"],
)
def test_a_state_file_outside_its_directory_is_refused_before_it_is_read(tmp_path, crafted, why):
    """Each crafted name points at a valid state file elsewhere, which the old loader read silently."""
    outside = _processors(tmp_path / "outside")
    directory = _processors(tmp_path / "sent")
    os.symlink(outside / STATE, directory / "link.safetensors")
    _set_state_file(directory, crafted.replace("{outside}", str(outside)))
    with pytest.raises(UnsafePathError) as info:
        load_processors(directory)
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert str(directory / PRE) in message and "steps[3].state_file" in message and why in message


def test_a_missing_state_file_keeps_its_sentence(tmp_path):
    directory = _processors(tmp_path / "sent")
    (directory / STATE).unlink()
    with pytest.raises(FileNotFoundError, match=r"needs .*_processor.safetensors, which is missing"):
        load_processors(directory)


def _hub_snapshot(root: Path, source: Path, blob_root: Path | None = None) -> Path:
    """``source``'s files laid out as the Hub cache does: ``snapshots/<rev>/<name>`` a symlink into
    ``blobs/`` (of ``blob_root``, default the repository's own)."""
    repo = root / "models--org--name"
    blobs = (blob_root or repo) / "blobs"
    snapshot = repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(source.iterdir())):
        blob = blobs / f"blob{i}"
        shutil.copy(file, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    return snapshot


def test_a_hub_cache_snapshot_may_point_into_its_own_blobs_only(tmp_path):
    source = _processors(tmp_path / "source")
    snapshot = _hub_snapshot(tmp_path / "hub", source)
    assert links_root(snapshot) == tmp_path / "hub" / "models--org--name"
    assert links_root(source) is None
    pre, _ = load_processors(snapshot)
    assert pre.step("normalizer_processor").state_dict()

    stray = _hub_snapshot(tmp_path / "hub2", source, blob_root=tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=r"policy_preprocessor.json is a symlink .* it was not read"):
        load_processors(stray)  # the pipeline file itself first: not a byte of it is read


def test_a_pipeline_file_or_config_sidecar_symlinked_out_is_refused_before_it_is_read(tmp_path):
    from lerobot_ckpt import CheckpointError
    from lerobot_cli.custom_code import tokenizers_named_in
    from lerobot_cli.policies.extensions import merge_sidecar

    outside = _processors(tmp_path / "outside")
    directory = _processors(tmp_path / "sent")
    elsewhere = {"steps": [{"registry_name": "tokenizer_processor", "config": {"tokenizer_name": "o/t"}}]}
    (outside / "other.json").write_text(json.dumps(elsewhere))
    (directory / PRE).unlink()
    os.symlink(outside / "other.json", directory / PRE)
    with pytest.raises(CheckpointError, match=rf"{PRE} is a symlink .* it was not read"):
        load_processors(directory)
    assert tokenizers_named_in(directory / PRE) == []  # the early custom-code check does not read it either

    (outside / "config_extensions.json").write_text(json.dumps({"type": "act"}))
    os.symlink(outside / "config_extensions.json", directory / "config_extensions.json")
    with pytest.raises(CheckpointError, match=r"config_extensions.json is a symlink .* it was not read"):
        merge_sidecar({"type": "act"}, directory / "config.json")


def _adapter_dir(directory: Path) -> Path:
    """An ``adapter_config.json`` as peft writes it for this trainer's LoRA runs."""
    from peft import LoraConfig

    directory.mkdir(parents=True, exist_ok=True)
    LoraConfig(
        r=4, lora_alpha=4, target_modules=r"blocks\.\d+\.linear", base_model_name_or_path="b"
    ).save_pretrained(str(directory))
    return directory


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("r", 0, "must be an integer ≥ 1"),
        ("r", 2.5, "must be an integer ≥ 1"),
        ("r", True, "must be an integer ≥ 1"),
        ("target_modules", ".*", "matches every module name"),
        ("target_modules", "(", "is not a valid regular expression"),
        ("target_modules", [], "must be one regular expression or a non-empty list"),
        ("peft_type", "LOHA", "is not LORA"),
        ("lora_dropout", 1.0, "must be a number in [0, 1)"),
        ("lora_dropout", -0.1, "must be a number in [0, 1)"),
        ("lora_alpha", 0, "must be a number > 0"),
        ("rank_pattern", {"blocks": 0}, "not an integer rank ≥ 1"),
        ("alpha_pattern", {".*": 2}, "matches every module name"),
        ("bias", "some", "must be none, all or lora_only"),
        ("init_lora_weights", "evil", "must be true, false or one of"),
        ("megatron_core", "os", "peft imports the module it names"),
        ("megatron_config", {"x": 1}, "is set, and this trainer does not load adapters that set it"),
        ("task_type", "CAUSAL_LM", "is set, and this trainer does not load adapters that set it"),
        ("future_field", 3, "is set, and this trainer does not load adapters that set it"),
    ],
)
def test_every_adapter_field_is_checked_in_one_line(tmp_path, key, value, why):
    from lerobot_cli.peft.adapterfile import read_adapter_config
    from lerobot_cli.peft.basefile import PeftSetupError

    directory = _adapter_dir(tmp_path / "adapter")
    assert read_adapter_config(directory)["r"] == 4  # peft's own file passes as written
    file = directory / "adapter_config.json"
    data = json.loads(file.read_text())
    data[key] = value
    file.write_text(json.dumps(data))
    with pytest.raises(PeftSetupError) as info:
        read_adapter_config(directory)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and f"{file}: {key} = " in message and why in message


def test_an_adapter_config_symlinked_out_of_its_directory_is_refused(tmp_path):
    from lerobot_ckpt import CheckpointError
    from lerobot_cli.peft.basefile import recorded_base

    outside = _adapter_dir(tmp_path / "outside")
    directory = tmp_path / "sent"
    directory.mkdir()
    os.symlink(outside / "adapter_config.json", directory / "adapter_config.json")
    with pytest.raises(CheckpointError, match=r"adapter_config.json is a symlink .* it was not read"):
        recorded_base(directory)


def _mlp_dir(directory: Path) -> Path:
    from lerobot_cli.policies.mlp.config import MLPConfig
    from lerobot_cli.policies.weights import build_policy, save_pretrained

    config = MLPConfig(
        input_features={"observation.state": PolicyFeature("STATE", (3,))},
        output_features={"action": PolicyFeature("ACTION", (2,))},
        hidden_dim=8,
    )
    return save_pretrained(build_policy(config), config, directory)


def test_weights_of_another_kind_are_refused_and_other_floats_converted_with_a_warning(tmp_path, caplog):
    import torch
    from lerobot_ckpt.errors import ModelMismatchError
    from lerobot_cli.policies.weights import load_policy
    from safetensors.torch import load_file, save_file

    directory = _mlp_dir(tmp_path / "mlp")
    file = directory / "model.safetensors"
    honest = load_file(file)
    save_file({k: v.half() for k, v in honest.items()}, str(file))
    with caplog.at_level("WARNING"):
        _, policy = load_policy(directory)
    warned = [r.getMessage() for r in caplog.records if "another float type" in r.getMessage()]
    assert len(warned) == 1 and "(float16 to float32)" in warned[0], caplog.text
    assert all(p.dtype == torch.float32 for p in policy.parameters())

    save_file(
        {k: v.to(torch.int64) if k == "action_head.weight" else v for k, v in honest.items()}, str(file)
    )
    with pytest.raises(
        ModelMismatchError, match=r"tensor action_head.weight is stored as int64 where the policy"
    ):
        load_policy(directory)


def test_a_config_that_cannot_fit_in_memory_is_refused_before_it_is_built(tmp_path, monkeypatch):
    from lerobot_cli.policies import weights

    directory = _mlp_dir(tmp_path / "mlp")
    _, policy = weights.load_policy(directory)
    needed = sum(p.numel() * p.element_size() for p in policy.state_dict().values())
    monkeypatch.setattr(weights, "_memory_bytes", lambda device: (needed - 1, "RAM"))
    built = []
    monkeypatch.setattr(weights, "build_policy", lambda config: built.append(config))
    with pytest.raises(
        weights.PolicyTooLargeError, match=r"config.json: this config builds a mlp policy of .* GiB of RAM"
    ):
        weights.load_policy(directory)
    assert not built, "the policy was built before its size was checked"


def test_a_config_json_or_weights_symlinked_out_are_refused(tmp_path):
    from lerobot_ckpt import CheckpointError
    from lerobot_cli.policies.weights import load_policy

    outside = _mlp_dir(tmp_path / "outside")
    for i, name in enumerate(("config.json", "model.safetensors")):
        directory = _mlp_dir(tmp_path / f"sent{i}")
        (directory / name).unlink()
        os.symlink(outside / name, directory / name)
        with pytest.raises(CheckpointError, match=rf"{name} is a symlink .* it was not read"):
            load_policy(directory)


@pytest.mark.parametrize(
    "fields, what",
    [
        ({"action_dim": 3, "proprio_dim": 2}, "action"),
        ({"action_dim": 2, "proprio_dim": 5}, "observation.state"),
    ],
)
def test_a_pretrained_fastwam_on_other_widths_says_they_cannot_change(fields, what):
    """The fresh-policy message suggests --policy.action_dim=<the dataset's>, which then fails on the saved
    action_dit_config; a --policy.path policy gets what can work instead."""
    from lerobot_cli.policies.dataset_fit import policy_config_for_dataset
    from lerobot_cli.policies.fastwam.config import FastWAMConfig

    features = json.loads((Path(__file__).parents[3] / "data/lerobot/demo_reach/meta/info.json").read_text())
    saved = FastWAMConfig(variant="tiny", pretrained_path="/ckpt/pretrained_model", **fields)
    with pytest.raises(ValueError) as info:
        policy_config_for_dataset(saved, features["features"]).validate_features()
    message = str(info.value)
    assert message.startswith(f"the dataset's {what} has shape [2], but the pretrained policy /ckpt/")
    assert "a pretrained policy's widths cannot change" in message and "pass --policy." not in message
    assert "--policy.base_model_id=/ckpt/pretrained_model" in message
    fresh = FastWAMConfig(variant="tiny", **fields)  # a fresh policy keeps the flag's suggestion
    with pytest.raises(ValueError, match="; pass --policy."):
        policy_config_for_dataset(fresh, features["features"]).validate_features()
