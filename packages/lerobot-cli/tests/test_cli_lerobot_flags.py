"""LeRobot 0.6.1's lerobot-train flags here: those whose feature is missing are accepted at their off values
and refused in one line when switched on; the DataLoader and run flags carry LeRobot's meaning and default.
(``tools/interop/flags_lerobot_interop.py`` runs every flag of LeRobot's own ``--help`` through a dry run.)"""

from __future__ import annotations

import pytest
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.cli.errors import UsageError

BASE = ["--dataset.repo_id=org/x", "--policy.type=mlp"]


def build(*flags: str):
    return build_train_config(split_argv([*BASE, *flags]).flags).config


@pytest.mark.parametrize(
    "flag",
    [
        "--wandb.enable=false",
        "--wandb.project=lerobot",
        "--wandb.mode=null",
        "--env=null",
        "--env.type=null",
        "--env_eval_freq=20000",
        "--eval.n_episodes=50",
        "--dataset.image_transforms.enable=false",
        "--dataset.image_transforms.max_num_transforms=3",
        "--image_transforms=null",
        "--rename_map={}",
        "--job.target=null",
        "--job.image=huggingface/lerobot-gpu:latest",
        "--reward_model=null",
        "--sample_weighting=null",
        "--save_checkpoint_to_hub=false",
        "--dataset.repo_type=dataset",
        "--dataset.depth_output_unit=mm",
        "--dataset=null",
    ],
)
def test_a_lerobot_flag_at_its_off_value_changes_nothing(flag):
    assert build(flag) == build()


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--wandb.enable=maybe", "--wandb.enable: expected a boolean"),
        ("--eval.recording=true", "the per-episode results are in eval_info.json"),
        ("--image_transforms=transforms.json", "pass their fields as flags (--dataset.image_transforms"),
        ("--job.target=a10g-small", "run the same command under torchrun or accelerate launch"),
        ("--reward_model.type=classifier", "reward model training"),
        ("--dataset.repo_type=bucket", "an HF Storage Bucket is not read here yet"),
        ("--dataset.depth_output_unit=m", "depth maps are not dequantized here"),
        ("--dataset=dataset.json", "a section's own config file"),
    ],
)
def test_a_missing_feature_switched_on_is_refused_in_one_line(flag, says):
    with pytest.raises(UsageError) as err:
        build(flag)
    message = str(err.value)
    assert says in message and "\n" not in message and "unknown flag" not in message
    assert message.startswith(flag.split("=", 1)[0])  # names the flag


def test_the_dataloader_and_run_flags_have_lerobots_defaults_and_meaning():
    cfg = build()
    assert (cfg.prefetch_factor, cfg.persistent_workers, cfg.tolerance_s) == (4, True, 1e-4)
    assert cfg.cudnn_deterministic is False and cfg.use_policy_training_preset is True
    assert cfg.dataloader_multiprocessing_context is None  # fork here (LeRobot: spawn), said in --help
    cfg = build(
        "--prefetch_factor=2",
        "--persistent_workers=false",
        "--dataloader_multiprocessing_context=spawn",
        "--tolerance_s=0.001",
        "--cudnn_deterministic=true",
        "--dataset.return_uint8=true",
    )
    assert (cfg.prefetch_factor, cfg.persistent_workers, cfg.tolerance_s) == (2, False, 0.001)
    assert cfg.dataloader_multiprocessing_context == "spawn" and cfg.cudnn_deterministic
    with pytest.raises((UsageError, ValueError), match="invalid choice 'thread'"):
        build("--dataloader_multiprocessing_context=thread")
    with pytest.raises((UsageError, ValueError), match="--tolerance_s must be a number of seconds > 0"):
        build("--tolerance_s=0")


def test_the_loader_takes_the_dataloader_flags():
    from types import SimpleNamespace

    import torch
    from lerobot_cli.data_source import _loader_kwargs

    runtime = SimpleNamespace(device=torch.device("cpu"))
    kwargs = _loader_kwargs(build("--num_workers=2", "--prefetch_factor=3", "--persistent_workers=false",
                                  "--dataloader_multiprocessing_context=spawn"), runtime)  # fmt: skip
    assert (kwargs["prefetch_factor"], kwargs["persistent_workers"]) == (3, False)
    assert kwargs["multiprocessing_context"] == "spawn"
    kwargs = _loader_kwargs(build("--num_workers=0"), runtime)  # no worker: nothing to prefetch or keep
    assert (kwargs["prefetch_factor"], kwargs["persistent_workers"], kwargs["multiprocessing_context"]) == (
        None, False, None)  # fmt: skip


def test_uploading_checkpoints_needs_a_repository_and_checkpoints():
    assert build("--save_checkpoint_to_hub=true", "--policy.repo_id=me/x").save_checkpoint_to_hub
    with pytest.raises(UsageError, match="give --policy.repo_id=<user>/<name>"):
        build("--save_checkpoint_to_hub=true")
    with pytest.raises(UsageError, match="no checkpoint would be written"):
        build("--save_checkpoint_to_hub=true", "--policy.repo_id=me/x", "--save_checkpoint=false")


def test_without_the_policy_presets_the_optimizer_and_scheduler_must_be_given():
    with pytest.raises(UsageError, match="give --optimizer.type and --scheduler.type"):
        build("--use_policy_training_preset=false")
    cfg = build("--use_policy_training_preset=false", "--optimizer.type=adamw", "--optimizer.lr=0.5",
                "--scheduler.type=cosine_decay_with_warmup")  # fmt: skip
    assert cfg.optimizer.lr == 0.5 and cfg.scheduler.type == "cosine_decay_with_warmup"
    assert cfg.optimizer != build().optimizer  # not the preset's


def test_image_transforms_are_lerobots_flags_with_its_meaning():
    """``--dataset.image_transforms.*`` is a config section now: each flag sets its field, and ``tfs``
    replaces the whole dict as LeRobot's parser does (an entry's missing fields take their defaults)."""
    cfg = build(
        "--dataset.image_transforms.enable=true",
        "--dataset.image_transforms.max_num_transforms=2",
        "--dataset.image_transforms.random_order=true",
        '--dataset.image_transforms.tfs={"b":{"weight":2.0,"type":"ColorJitter","kwargs":{"brightness":[0.5,1.5]}},'
        '"i":{}}',
    ).dataset.image_transforms
    assert (cfg.enable, cfg.max_num_transforms, cfg.random_order) == (True, 2, True)
    assert list(cfg.tfs) == ["b", "i"] and cfg.tfs["b"].kwargs == {"brightness": (0.5, 1.5)}
    assert (cfg.tfs["i"].weight, cfg.tfs["i"].type, cfg.tfs["i"].kwargs) == (1.0, "Identity", {})
    assert build().dataset.image_transforms.enable is False
    for flag, says in (
        ("--dataset.image_transforms.max_num_transforms=-1", "must be a whole number >= 0"),
        ('--dataset.image_transforms.tfs={"x":{"type":"GaussianNoise"}}', "'x' has type 'GaussianNoise'"),
        ('--dataset.image_transforms.tfs={"x":{"weight":-2}}', "'x' has weight -2.0"),
        ('--dataset.image_transforms.tfs={"x":{"type":"ColorJitter","kwargs":{"hue":0.9}}}', "hue must"),
    ):
        with pytest.raises(UsageError) as err:
            build(flag)
        assert says in str(err.value) and str(err.value).startswith("--dataset.image_transforms")


def test_help_shows_the_default_transforms_as_the_json_a_flag_takes():
    import json

    from lerobot_cli.cli.help import render_help

    line = next(ln for ln in render_help(None).splitlines() if "--dataset.image_transforms.tfs " in ln)
    default = json.loads(line.split("(default: ", 1)[1].removesuffix(")"))
    assert default["affine"] == {
        "weight": 1.0,
        "type": "RandomAffine",
        "kwargs": {"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]},
    }
    assert list(default) == ["brightness", "contrast", "saturation", "hue", "sharpness", "affine"]


def test_env_and_eval_flags_build_lerobots_sections_and_round_trip():
    from lerobot_cli import configio

    cfg = build("--env.type=pusht", "--env.episode_length=20", "--eval.n_episodes=4", "--env_eval_freq=5")
    assert (cfg.env.type, cfg.env.episode_length, cfg.env.task) == ("pusht", 20, "PushT-v0")
    assert (cfg.eval.n_episodes, cfg.eval.batch_size, cfg.env_eval_freq) == (4, 0, 5)
    data = configio.unstructure_train_config(cfg)
    assert data["env"]["type"] == "pusht" and configio.structure_train_config(data, "f") == cfg
    assert build("--env.type=null").env is None and build("--env=null").env is None


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--env.task=PushT-v0"], "--env.task needs an env: pass --env.type=NAME (pusht, aloha)"),
        (["--env.type=mujoco"], "--env.type: invalid choice 'mujoco' (choose from pusht, aloha)"),
        (["--env=env.json"], "an env's own config file is not read here"),
        (["--env.type=pusht", "--env.obs_type=state"], "--env.obs_type: invalid choice 'state'"),
        (["--env.type=pusht", "--env.episode_length=0"], "--env.episode_length must be a positive integer"),
        (["--env_eval_freq=-1"], "--env_eval_freq"),
        (["--eval.n_episodes=0"], "--eval.n_episodes must be an integer >= 1"),
    ],
)
def test_bad_env_and_eval_flags_are_one_line(flags, says):
    with pytest.raises(UsageError) as err:
        build(*flags)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_config_file_with_an_unknown_env_key_names_it(tmp_path):
    import json

    from lerobot_cli import configio

    data = configio.unstructure_train_config(build("--env.type=pusht"))
    data["env"]["bogus"] = 1
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"unknown key\(s\) env.bogus"):
        build_train_config({"config_path": str(path)})
