"""config.json holds LeRobot's fields only; ours go to config_extensions.json beside it.

LeRobot's parser refuses a config.json with a key its config class lacks, so a pi0 with a local tokenizer or
a tiny SigLIP used to write a checkpoint LeRobot could not open. ``data/lerobot_config_fields.json`` is
LeRobot 0.6.1's dataclass fields per policy type, written by ``tools/interop/config_lerobot_interop.py
lerobot-fields`` (its ``run`` checks the file is current and that LeRobot parses every setting's config.json).
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import attrs
import pytest
from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies import registry
from lerobot_cli.policies.serialization import (
    UnknownConfigKeysWarning,
    load_policy_config,
    policy_config_extensions,
    policy_config_to_dict,
    save_policy_config,
)

_spec = importlib.util.spec_from_file_location("policy_tables", Path(__file__).parent / "policy_tables.py")
policy_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(policy_tables)

LEROBOT = json.loads((Path(__file__).parent / "data" / "lerobot_config_fields.json").read_text())
# The fields of ours that LeRobot's class of the same type lacks, pinned: a new one must be a decision.
EXTENSIONS = {
    "act": (),
    "diffusion": (),
    "fastwam": ("compile_action_infer", "precompute_task_contexts", "variant"),
    "mlp": (),
    "pi0": ("tokenizer_name", "vision_variant"),
    "pi05": ("tokenizer_name", "vision_variant"),
    "smolvla": (),
}
FEATURES = {
    "input_features": {
        "observation.state": PolicyFeature("STATE", (6,)),
        "observation.wrist_rgb": PolicyFeature("VISUAL", (3, 56, 56)),
        "observation.top": PolicyFeature("VISUAL", (3, 56, 56)),
    },
    "output_features": {"action": PolicyFeature("ACTION", (6,))},
}
TINY_VLA = {
    "paligemma_variant": "gemma_tiny",
    "action_expert_variant": "gemma_tiny",
    "vision_variant": "tiny",
    "image_resolution": (56, 56),
}
# Settings per policy, the ones that used to break LeRobot's parser first (a registered policy missing here is
# checked at its defaults, and fails test_every_registered_policy_is_pinned).
SETTINGS = {
    "pi0": [
        {"tokenizer_name": "/data/tokenizers/paligemma_local"},
        TINY_VLA,
        {"tokenizer_name": "me/tok"},
        {},
    ],
    "pi05": [{"tokenizer_name": "/data/tokenizers/paligemma_local"}, TINY_VLA, {}],
    "act": [{}, {"pre_norm": True, "use_vae": False, "pretrained_backbone_weights": None}],
    "diffusion": [{}, {"noise_scheduler_type": "DDIM", "resize_shape": (48, 48), "crop_ratio": 0.8}],
    "mlp": [{}, {"hidden_dim": 8}],
    "smolvla": [{}, {"vlm_model_name": "/data/vlm/smolvlm_local", "num_vlm_layers": 4}],
    "fastwam": [
        {"action_dim": 6, "proprio_dim": 6},
        {"action_dim": 6, "proprio_dim": 6, "variant": "tiny", "compile_action_infer": True},
    ],
}
CASES = [(policy, setting) for policy in registry.available() for setting in SETTINGS.get(policy, [{}])]
# What each table of this file must cover: every registered policy (the registry's list, not a copy).
TABLES = {
    "pinned extension fields (EXTENSIONS in test_policy_config_extensions.py)": EXTENSIONS,
    "settings for LeRobot's parser (SETTINGS in test_policy_config_extensions.py)": SETTINGS,
    "LeRobot fields in tests/data/lerobot_config_fields.json (rewrite it: tools/interop/"
    "config_lerobot_interop.py run, then copy its lerobot_config_fields.json)": LEROBOT["fields"],
}


def test_every_registered_policy_is_pinned():
    for what, table in TABLES.items():
        policy_tables.require_every_policy(table, what)
    assert LEROBOT["lerobot_version"] == "0.6.1"


@pytest.mark.parametrize("policy", registry.available())
def test_in_lerobot_is_whether_lerobot_0_6_1_has_the_type(policy):
    """The spec's ``in_lerobot`` (which the interop drivers and ci.sh read) agrees with LeRobot's own list of
    config classes, as its ``lerobot-fields`` wrote it."""
    assert policy in LEROBOT["fields"], policy_tables.unlisted(LEROBOT["fields"], "LeRobot fields", [policy])
    assert registry.config_class(policy).spec.in_lerobot == (LEROBOT["fields"][policy] is not None)


@pytest.mark.parametrize("policy", registry.available())
def test_extension_fields_are_exactly_the_fields_lerobots_class_lacks(policy):
    cls = registry.config_class(policy)
    declared = tuple(sorted(cls.spec.extension_fields))
    assert policy in EXTENSIONS, policy_tables.unlisted(EXTENSIONS, "pinned extension fields", [policy])
    assert declared == EXTENSIONS[policy]
    lerobot = LEROBOT["fields"][policy]
    if lerobot is None:  # LeRobot has no such policy (mlp): config.json keeps every field, nothing goes aside
        assert declared == ()
        return
    ours = {a.name for a in attrs.fields(cls)}
    assert ours - set(lerobot) == set(declared)
    assert set(lerobot) <= ours  # every LeRobot field is read (none silently dropped as unknown)


@pytest.mark.parametrize(("policy", "setting"), CASES)
def test_config_json_holds_only_lerobots_fields_for_every_setting(tmp_path, policy, setting):
    cfg = registry.config_class(policy)(**FEATURES, **setting)
    file = save_policy_config(cfg, tmp_path)
    written = json.loads(file.read_text())
    sidecar = tmp_path / "config_extensions.json"
    assert written == json.loads(json.dumps(policy_config_to_dict(cfg)))
    if LEROBOT["fields"][policy] is None:
        assert not sidecar.exists() and set(written) == {"type", *(a.name for a in attrs.fields(type(cfg)))}
    else:
        assert set(written) <= {"type", *LEROBOT["fields"][policy]}
        assert sidecar.exists() == bool(EXTENSIONS[policy])
    if EXTENSIONS[policy]:
        extra = json.loads(sidecar.read_text())
        assert extra == {"type": policy, **{name: getattr(cfg, name) for name in EXTENSIONS[policy]}}
        assert extra == policy_config_extensions(cfg)
    # the cameras stay in the config's order, whatever their names
    assert [k for k, f in written["input_features"].items() if f["type"] == "VISUAL"] == [
        "observation.wrist_rgb",
        "observation.top",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_policy_config(tmp_path) == cfg


def _pi0(**setting):
    return registry.config_class("pi0")(**FEATURES, **setting)


def test_a_checkpoint_without_the_sidecar_loads_with_those_fields_defaults(tmp_path):
    cfg = _pi0(tokenizer_name="/data/tokenizers/paligemma_local")
    save_policy_config(cfg, tmp_path)
    (
        tmp_path / "config_extensions.json"
    ).unlink()  # LeRobot's own checkpoints, or a copy of config.json alone
    assert load_policy_config(tmp_path) == attrs.evolve(cfg, tokenizer_name="google/paligemma-3b-pt-224")


def test_a_config_json_from_before_the_sidecar_still_loads(tmp_path):
    cfg = _pi0(**TINY_VLA, tokenizer_name="/data/tok")
    old = {**policy_config_to_dict(cfg), **policy_config_extensions(cfg)}  # our fields inside config.json
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert load_policy_config(tmp_path) == cfg
    _write(tmp_path, old, policy_config_extensions(cfg))  # and a sidecar that agrees with it
    assert load_policy_config(tmp_path) == cfg


def _write(directory: Path, config: dict, sidecar: dict) -> None:
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "config_extensions.json").write_text(json.dumps(sidecar))


@pytest.mark.parametrize(
    ("config", "sidecar", "message"),
    [
        (
            {"vision_variant": "so400m"},
            {"type": "pi0", "vision_variant": "tiny"},
            r"vision_variant is 'so400m' in .*config\.json but 'tiny' in .*config_extensions\.json",
        ),
        ({}, {"type": "pi05", "vision_variant": "tiny"}, r"is for policy type 'pi05' but .* is 'pi0'"),
        ({}, {"vision_variant": "tiny"}, r"is for policy type None"),
        (
            {},
            {"type": "pi0", "chunk_size": 7},
            r"chunk_size belongs in config\.json \(LeRobot's pi0 config has it\)",
        ),
    ],
)
def test_a_sidecar_that_disagrees_with_config_json_is_refused(tmp_path, config, sidecar, message):
    _write(tmp_path, {**policy_config_to_dict(_pi0()), **config}, sidecar)
    with pytest.raises(ValueError, match=message):
        load_policy_config(tmp_path)


def test_sidecar_keys_the_policy_does_not_define_are_ignored_with_a_warning(tmp_path):
    _write(
        tmp_path, policy_config_to_dict(_pi0()), {"type": "pi0", "tokenizer_name": "me/tok", "future_knob": 1}
    )
    with pytest.warns(
        UnknownConfigKeysWarning, match="config_extensions.json: ignoring keys .*: future_knob"
    ):
        assert load_policy_config(tmp_path) == _pi0(tokenizer_name="me/tok")


def test_a_sidecar_that_is_not_a_json_object_names_the_file(tmp_path):
    save_policy_config(_pi0(), tmp_path)
    (tmp_path / "config_extensions.json").write_text("[1")
    with pytest.raises(ValueError, match=r"config_extensions\.json is not valid JSON"):
        load_policy_config(tmp_path)
    (tmp_path / "config_extensions.json").write_text("[1]")
    with pytest.raises(TypeError, match=r"config_extensions\.json must hold a JSON object, got list"):
        load_policy_config(tmp_path)


def test_saving_a_policy_without_extensions_removes_a_stale_sidecar(tmp_path):
    save_policy_config(_pi0(tokenizer_name="me/tok"), tmp_path)
    act = registry.config_class("act")(**FEATURES)
    save_policy_config(act, tmp_path)
    assert not (tmp_path / "config_extensions.json").exists() and load_policy_config(tmp_path) == act


def test_a_tiny_siglip_needs_the_tiny_gemma_so_lerobot_refuses_its_config_json():
    """vision_variant is not in config.json: with a full-size Gemma, LeRobot would read the file as a so400m
    model (and its pi0 loader keeps random weights when ours do not fit). gemma_tiny makes LeRobot refuse
    it."""
    with pytest.raises(
        ValueError, match=r"--policy.vision_variant=tiny needs --policy.paligemma_variant=gemma_tiny"
    ):
        _pi0(vision_variant="tiny", image_resolution=(56, 56))
    assert policy_config_to_dict(_pi0(**TINY_VLA))["paligemma_variant"] == "gemma_tiny"


@pytest.mark.parametrize(
    ("rtc", "message"),
    [
        ({}, r"enabled=true \(LeRobot's default when the key is missing\)"),
        ({"enabled": False, "horizon": 3}, r"--policy.rtc_config: unknown keys horizon"),
    ],
)
def test_rtc_config_means_to_us_what_it_means_to_lerobot(rtc, message):
    """LeRobot reads {} as RTCConfig(enabled=True) and refuses keys RTCConfig lacks."""
    with pytest.raises(ValueError, match=message):
        _pi0(rtc_config=rtc)
    assert _pi0(rtc_config={"enabled": False, "execution_horizon": 5}).rtc_config["enabled"] is False


def test_policy_path_reads_the_sidecar_and_flags_override_it(tmp_path):
    """--policy.path takes our settings from config_extensions.json (train_config.json then records them), and
    a sidecar key the policy lacks is one warning naming the file, as for config.json."""
    from lerobot_cli.cli.argv import split_argv
    from lerobot_cli.cli.build import build_train_config

    pretrained = tmp_path / "pretrained_model"
    save_policy_config(_pi0(**TINY_VLA, tokenizer_name="/data/tok"), pretrained)
    extra = json.loads((pretrained / "config_extensions.json").read_text())
    (pretrained / "config_extensions.json").write_text(json.dumps({**extra, "future_knob": 1}))
    result = build_train_config(
        split_argv(
            ["--dataset.repo_id=a/b", f"--policy.path={tmp_path}", "--policy.tokenizer_name=/other/tok"]
        ).flags
    )
    policy = result.config.policy
    assert (policy.vision_variant, policy.paligemma_variant, policy.tokenizer_name) == (
        "tiny",
        "gemma_tiny",
        "/other/tok",
    )
    assert any(
        "config_extensions.json: ignoring keys the pi0 policy does not define: future_knob" in w
        for w in result.warnings
    )
