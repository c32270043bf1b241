"""The flag parser and config tree in-process: precedence, types, presets, round trip."""

import json
import re

import pytest
from lerobot_ckpt import CheckpointFormat
from lerobot_cli import configio
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.cli.errors import UsageError
from lerobot_cli.config import TrackioConfig, TrainConfig, WandBConfig
from lerobot_cli.datasets.config import DatasetConfig
from lerobot_cli.envs import PushtEnvConfig
from lerobot_cli.evaluation.config import EvalConfig
from lerobot_cli.features import FeatureType, NormalizationMode, PolicyFeature
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.peft.config import PeftConfig
from lerobot_cli.policies import config_class
from lerobot_cli.sample_weighting.config import SampleWeightingConfig
from lerobot_parallel.config import (
    AcceleratorConfig,
    DDPConfig,
    FSDPConfig,
    GradientAccumulationConfig,
    MixedPrecisionPolicyConfig,
    ParallelismConfig,
)
from lerobot_trainloop.config import EmaConfig


def build(*argv: str) -> TrainConfig:
    return build_train_config(split_argv(list(argv)).flags).config


def test_equals_and_space_forms():
    a = build("--steps=5", "--batch_size", "3", "--dataset.repo_id", "a/b")
    assert (a.steps, a.batch_size, a.dataset.repo_id) == (5, 3, "a/b")


def test_negative_value_after_space():
    assert build("--parallelism.dp_shard", "-1").parallelism.dp_shard == -1


@pytest.mark.parametrize(
    ("raw", "value"), [("true", True), ("1", True), ("false", False), ("0", False), ("True", True)]
)
def test_booleans(raw, value):
    assert build(f"--save_checkpoint={raw}").save_checkpoint is value


def test_every_boolean_spelling_the_parser_accepts_is_documented():
    """yes/no/on/off are accepted (any case), so the error text, --help and the README list them too."""
    from pathlib import Path

    from lerobot_cli.cli import schema
    from lerobot_cli.cli.help import render_help

    with pytest.raises(UsageError) as exc:
        build("--save_checkpoint=maybe")
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    paragraph = readme[readme.index("Flags are dotted paths") :].split("\n\n")[0]
    documented = {
        w
        for quoted in re.findall(r"`([^`]*)`", paragraph[: paragraph.index("lists")])
        for w in quoted.split("/")
    }
    intro = render_help(None).split("\n\n")[1]
    listed = set(re.findall(r"\w+", re.search(r"expected a boolean \(([^)]*)\)", str(exc.value)).group(1)))
    for word in schema._TRUE + schema._FALSE:
        for case in (word, word.upper()):
            assert build(f"--save_checkpoint={case}").save_checkpoint is (word in schema._TRUE)
        assert word in listed and word in documented and word in re.findall(r"\w+", intro), word


def known_flag_specs():
    """Every flag of the config tree and of every registered policy's fields."""
    from lerobot_cli.cli.build import known_flags
    from lerobot_cli.policies import registry

    specs = dict(known_flags(None))
    for name in registry.available():
        specs.update(known_flags(config_class(name)))
    return specs


def test_none_is_the_choice_wherever_it_is_one():
    """`none` is read as null, except where it is a valid choice: activation checkpointing's default mode
    (was refused as "cannot be null")."""
    from lerobot_cli.cli.schema import convert

    with_none = [s for s in known_flag_specs().values() if s.choices and "none" in s.choices]
    assert [s.path for s in with_none] == ["accelerator.activation_checkpointing.mode"]
    for spec in with_none:
        assert convert(spec, "none") == "none"
    cfg = build("--accelerator.activation_checkpointing.mode=none")
    assert cfg.accelerator.activation_checkpointing.mode == "none"
    with pytest.raises(
        UsageError, match=r"mode cannot be null \(expected str; choose from none, full, selective\)"
    ):
        build("--accelerator.activation_checkpointing.mode=null")


def test_a_resume_can_turn_activation_checkpointing_off(tmp_path):
    saved = build("--policy.type=mlp", "--accelerator.activation_checkpointing.mode=full")
    configio.save_train_config(saved, tmp_path)
    cfg = build(
        f"--config_path={tmp_path}", "--resume=true", "--accelerator.activation_checkpointing.mode=none"
    )
    assert cfg.accelerator.activation_checkpointing.mode == "none" and cfg.resume


def test_none_against_the_policys_own_checkpointing_switch_is_refused():
    from lerobot_cli.cli.checks import check_checkpointing_off

    flags = {
        "policy.type": "pi0",
        "policy.gradient_checkpointing": "true",
        "accelerator.activation_checkpointing.mode": "none",
    }
    cfg = build_train_config(flags).config
    with pytest.raises(UsageError, match=r"add --policy.gradient_checkpointing=false to turn it off"):
        check_checkpointing_off(cfg, flags)
    check_checkpointing_off(
        cfg, {k: v for k, v in flags.items() if k.startswith("policy.")}
    )  # none by default
    flags["policy.gradient_checkpointing"] = "false"
    check_checkpointing_off(build_train_config(flags).config, flags)
    # FastWAM's switch has another name, and the line names it
    fastwam = {
        "policy.type": "fastwam",
        "policy.use_gradient_checkpointing": "true",
        "accelerator.activation_checkpointing.mode": "none",
    }
    with pytest.raises(UsageError, match=r"add --policy.use_gradient_checkpointing=false to turn it off"):
        check_checkpointing_off(build_train_config(fastwam).config, fastwam)


def test_bare_boolean_flag():
    assert build("--dry_run").dry_run is True


def test_json_list_and_null():
    cfg = build(
        '--accelerator.fsdp.wrap_modules=["ACTEncoderLayer", "ACTDecoderLayer"]', "--dataset.episodes=[0,3,5]"
    )
    assert cfg.accelerator.fsdp.wrap_modules == ("ACTEncoderLayer", "ACTDecoderLayer")
    assert cfg.dataset.episodes == (0, 3, 5)
    assert build("--dataset.episodes=null").dataset.episodes is None
    assert build("--dataset.root=None").dataset.root is None


def test_enum_flag():
    assert build("--checkpoint_format=dcp").checkpoint_format is CheckpointFormat.DCP


def test_policy_type_then_fields():
    cfg = build("--policy.type=mlp", "--policy.hidden_dim=7")
    assert cfg.policy.type == "mlp" and cfg.policy.hidden_dim == 7


def test_policy_fields_before_type_are_order_independent():
    assert build("--policy.hidden_dim=7", "--policy.type=mlp").policy.hidden_dim == 7


def test_policy_preset_fills_optimizer_and_flags_override():
    cfg = build("--policy.type=mlp", "--policy.optimizer_lr=0.5", "--optimizer.weight_decay=0.25")
    assert cfg.optimizer == OptimizerConfig(type="adamw", lr=0.5, weight_decay=0.25, grad_clip_norm=10.0)
    assert cfg.scheduler is None


def test_optional_section_enabled_by_a_field():
    cfg = build("--peft.r=4", "--scheduler.num_warmup_steps=3")
    assert cfg.peft == PeftConfig(r=4)
    assert cfg.scheduler == SchedulerConfig(num_warmup_steps=3)


def test_whole_optional_section_as_json_or_null():
    assert build('--peft={"r": 8}').peft == PeftConfig(r=8)
    assert build("--policy.type=mlp", "--optimizer=null").optimizer is None


def test_policy_path_loads_config_and_overrides(tmp_path):
    pretrained = tmp_path / "pretrained_model"
    pretrained.mkdir()
    policy = config_class("mlp")(hidden_dim=11, n_blocks=3)
    data = configio.unstructure_policy_config(policy)
    data["some_future_lerobot_field"] = 1
    (pretrained / "config.json").write_text(json.dumps(data))
    result = build_train_config(split_argv([f"--policy.path={tmp_path}", "--policy.n_blocks=5"]).flags)
    cfg = result.config
    assert cfg.policy.hidden_dim == 11 and cfg.policy.n_blocks == 5
    assert cfg.policy.pretrained_path == str(pretrained)
    assert any("some_future_lerobot_field" in w for w in result.warnings)


def test_config_path_is_base_and_flags_override(tmp_path):
    base = build("--policy.type=mlp", "--steps=77", "--batch_size=5", "--optimizer.lr=0.125")
    configio.save_train_config(base, tmp_path)
    cfg = build(f"--config_path={tmp_path / 'train_config.json'}", "--batch_size=9")
    assert (cfg.steps, cfg.batch_size, cfg.optimizer.lr) == (77, 9, 0.125)
    # a directory holding pretrained_model/train_config.json is accepted too
    step = tmp_path / "005000" / "pretrained_model"
    step.mkdir(parents=True)
    configio.save_train_config(base, step)
    assert build(f"--config_path={tmp_path / '005000'}").steps == 77


def test_config_path_with_another_policy_type_replaces_the_policy(tmp_path):
    configio.save_train_config(build("--policy.type=mlp", "--policy.hidden_dim=3"), tmp_path)
    cfg = build(f"--config_path={tmp_path}", "--policy.type=mlp")
    assert cfg.policy.hidden_dim == 3  # same type keeps the saved fields


def every_section_non_default() -> TrainConfig:
    mlp = config_class("mlp")
    return TrainConfig(
        dataset=DatasetConfig(
            repo_id="me/data", root="/data/x", episodes=(0, 3, 5), eval_split=0.1, revision="v3.0"
        ),
        policy=mlp(
            hidden_dim=32,
            n_blocks=3,
            dropout=0.1,
            device="cpu",
            repo_id="me/policy",
            push_to_hub=False,
            tags=["a"],
            input_features={"observation.state": PolicyFeature(FeatureType.STATE, (4,))},
            output_features={"action": PolicyFeature(FeatureType.ACTION, (2,))},
            normalization_mapping={"STATE": NormalizationMode.MIN_MAX, "ACTION": NormalizationMode.IDENTITY},
        ),
        output_dir="outputs/x",
        job_name="job",
        resume=True,
        abandon_newer_checkpoints=True,
        rename_map={"observation.images.front": "observation.images.top"},
        seed=7,
        steps=123,
        batch_size=4,
        num_workers=0,
        prefetch_factor=2,
        persistent_workers=False,
        dataloader_multiprocessing_context="spawn",
        tolerance_s=0.01,
        cudnn_deterministic=True,
        use_policy_training_preset=False,
        save_checkpoint_to_hub=True,
        log_freq=3,
        save_freq=50,
        save_checkpoint=False,
        save_on_interrupt=False,
        checkpoint_format=CheckpointFormat.SAFETENSORS_DCP,
        checkpoint_async=True,
        optimizer=OptimizerConfig(
            type="adam", lr=0.1, weight_decay=0.2, betas=(0.8, 0.9), eps=1e-6, grad_clip_norm=1.0
        ),
        scheduler=SchedulerConfig(
            type="constant_with_warmup", num_warmup_steps=5, num_decay_steps=10, peak_lr=0.2, decay_lr=0.01
        ),
        peft=PeftConfig(
            r=4, lora_alpha=8, lora_dropout=0.1, target_modules=("q",), full_training_modules=("head",)
        ),
        sample_weighting=SampleWeightingConfig(
            type="rabc",
            progress_path="p.parquet",
            head_mode="dense",
            kappa=0.05,
            epsilon=1e-5,
            extra_params={"fallback_weight": 0.5},
        ),
        eval_steps=50,
        max_eval_samples=100,
        env=PushtEnvConfig(episode_length=40, obs_type="environment_state_agent_pos", fps=5),
        env_eval_freq=7,
        eval=EvalConfig(n_episodes=6, batch_size=3, use_async_envs=False),
        trackio=TrackioConfig(enable=True, project="p"),
        wandb=WandBConfig(
            enable=True,
            disable_artifact=True,
            project="p",
            entity="e",
            notes="n",
            run_id="abc123",
            mode="offline",
            add_tags=False,
        ),
        ema=EmaConfig(
            enable=True, decay=0.99, update_after_step=3, inv_gamma=2.0, power=0.5, use_for_eval=False
        ),
        parallelism=ParallelismConfig(dp_replicate=2, dp_shard=-1),
        accelerator=AcceleratorConfig(
            mixed_precision="fp16",
            gradient_accumulation=GradientAccumulationConfig(steps=3),
            fsdp=FSDPConfig(
                min_num_params=1000,
                reshard_after_forward=False,
                cpu_offload=True,
                ignored_modules=".*backbone",
                mixed_precision_policy=MixedPrecisionPolicyConfig("float16", "float32", "float32", True),
            ),
            ddp=DDPConfig(
                find_unused_parameters=True,
                broadcast_buffers=False,
                gradient_as_bucket_view=False,
                bucket_cap_mb=5,
            ),
            timeout_s=30.0,
        ),
        allow_nonfinite_loss=True,
        dry_run=True,
    )


def test_round_trip_every_section_non_default(tmp_path):
    cfg = every_section_non_default()
    default_json = configio.unstructure_train_config(TrainConfig())
    data = configio.unstructure_train_config(cfg)
    for key in default_json:  # the fixture really differs from the defaults everywhere
        assert data[key] != default_json[key], key
    path = configio.save_train_config(cfg, tmp_path)
    again = configio.load_train_config(path)
    assert again == cfg
    assert configio.unstructure_train_config(again) == data


def test_unknown_key_in_file_is_an_error(tmp_path):
    data = configio.unstructure_train_config(TrainConfig())
    data["accelerator"]["fsdp"]["wrap_modulez"] = ["A"]
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"unknown key\(s\) accelerator.fsdp.wrap_modulez"):
        build(f"--config_path={path}")


def test_flag_value_error_is_not_blamed_on_the_file(tmp_path):
    configio.save_train_config(TrainConfig(), tmp_path)
    with pytest.raises(UsageError) as exc:
        build(f"--config_path={tmp_path}", "--batch_size=0")
    assert str(exc.value) == "--batch_size must be an integer ≥ 1, got 0"


def test_finalized_defaults():
    import datetime as dt

    cfg = build("--policy.type=mlp", "--dataset.repo_id=lerobot/demo").finalized(
        dt.datetime(2026, 1, 2, 3, 4, 5)
    )
    assert cfg.job_name == "lerobot_demo_mlp"
    assert cfg.output_dir == "outputs/train/2026-01-02/03-04-05_lerobot_demo_mlp"


def test_unknown_policy_key_in_train_config_is_an_error(tmp_path):
    data = configio.unstructure_train_config(build("--policy.type=mlp"))
    data["policy"]["hiden_dim"] = 3
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"unknown key\(s\) policy.hiden_dim"):
        build(f"--config_path={path}")


def test_policy_path_hub_repo_id_goes_through_snapshot_download(tmp_path, monkeypatch):
    import huggingface_hub

    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    policy = config_class("mlp")(hidden_dim=9)
    (snapshot / "config.json").write_text(json.dumps(configio.unstructure_policy_config(policy)))
    calls = []

    def fake_snapshot_download(repo_id, repo_type=None, **kw):  # only the transport is faked
        calls.append((repo_id, repo_type))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    cfg = build("--policy.path=someone/my_policy")
    assert calls == [("someone/my_policy", "model")]
    assert cfg.policy.hidden_dim == 9 and cfg.policy.pretrained_path == str(snapshot)


def test_policy_path_hub_failure_is_one_sentence(monkeypatch):
    import huggingface_hub

    def offline(repo_id, **kw):
        raise OSError("We couldn't connect to the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(
        UsageError, match=r"--policy.path=someone/missing: not a local directory, and downloading"
    ):
        build("--policy.path=someone/missing")
