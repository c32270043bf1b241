"""The on-disk layout as code: names, step directories, `last`, and user-given resume paths."""

import os
from pathlib import Path

import pytest
from lerobot_ckpt import (
    CheckpointNotFoundError,
    CheckpointPaths,
    UnsafeCheckpointError,
    resolve_checkpoint_dir,
)
from lerobot_ckpt.discovery import latest_checkpoint, list_checkpoints, read_last, resolve_last
from lerobot_ckpt.layout import is_transient_name, parse_step_dir_name, staging_dir_name, step_dir_name


@pytest.mark.parametrize(
    ("step", "name"), [(0, "000000"), (5000, "005000"), (999_999, "999999"), (1_000_000, "1000000")]
)
def test_step_names_pad_to_six_and_widen(step, name):
    assert step_dir_name(step) == name
    assert parse_step_dir_name(name) == step


@pytest.mark.parametrize("bad", [-1, 1.0, True, "5"])
def test_step_must_be_a_non_negative_int(bad):
    with pytest.raises(ValueError):
        step_dir_name(bad)


@pytest.mark.parametrize(
    "name", ["last", "12345", "00500a", ".tmp-000005-12", ".old-000005-3", ".last-tmp-9"]
)
def test_non_step_names(name):
    assert parse_step_dir_name(name) is None


def test_transient_names_are_dot_prefixed():
    assert staging_dir_name(7, 123) == ".tmp-000007-123"
    assert is_transient_name(".tmp-000007-123") and is_transient_name(".last-tmp-5")
    assert not is_transient_name("000007") and not is_transient_name("last")


def test_every_file_name_of_the_documented_layout(tmp_path):
    p = CheckpointPaths(tmp_path / "005000")

    def rel(path):
        return path.relative_to(tmp_path / "005000").as_posix()

    assert [
        rel(x)
        for x in (
            p.policy_config,
            p.policy_config_extensions,
            p.train_config,
            p.model_weights,
            p.model_dcp,
            p.preprocessor_config,
            p.postprocessor_config,
            p.adapter_weights,
            p.adapter_config,
        )
    ] == [
        "pretrained_model/config.json",
        "pretrained_model/config_extensions.json",
        "pretrained_model/train_config.json",
        "pretrained_model/model.safetensors",
        "pretrained_model/pytorch_model_fsdp_0",
        "pretrained_model/policy_preprocessor.json",
        "pretrained_model/policy_postprocessor.json",
        "pretrained_model/adapter_model.safetensors",
        "pretrained_model/adapter_config.json",
    ]
    assert [
        rel(x)
        for x in (
            p.optimizer_param_groups,
            p.optimizer_state,
            p.optimizer_dcp,
            p.rng_state,
            p.scheduler_state,
            p.scaler_state,
            p.training_step,
        )
    ] == [
        "training_state/optimizer_param_groups.json",
        "training_state/optimizer_state.safetensors",
        "training_state/optimizer_0",
        "training_state/rng_state.safetensors",
        "training_state/scheduler_state.json",
        "training_state/scaler_state.json",
        "training_state/training_step.json",
    ]
    p.pretrained_model.mkdir(parents=True)
    for name in (
        "policy_postprocessor_step_0_unnormalizer.safetensors",
        "policy_preprocessor_step_3_normalizer.safetensors",
        "policy_preprocessor_step_1_x.safetensors",
    ):
        (p.pretrained_model / name).write_bytes(b"")
    assert [x.name for x in p.processor_state_files()] == [
        "policy_preprocessor_step_1_x.safetensors",
        "policy_preprocessor_step_3_normalizer.safetensors",
        "policy_postprocessor_step_0_unnormalizer.safetensors",
    ]
    assert p.step_from_name == 5000


def _fake_run(tmp_path: Path, steps, last=None) -> Path:
    ckpts = tmp_path / "run" / "checkpoints"
    for step in steps:
        paths = CheckpointPaths(ckpts / step_dir_name(step))
        paths.training_state.mkdir(parents=True)
        paths.pretrained_model.mkdir()
        paths.train_config.write_text("{}")
    if last is not None:
        os.symlink(step_dir_name(last), ckpts / "last")
    return ckpts


def test_listing_ignores_leftovers_and_sorts_numerically(tmp_path):
    ckpts = _fake_run(tmp_path, [999_999, 5, 1_000_000, 20], last=20)
    (ckpts / ".tmp-000030-77").mkdir()
    (ckpts / "notes").mkdir()
    assert [p.name for p in list_checkpoints(ckpts)] == ["000005", "000020", "999999", "1000000"]
    assert resolve_last(ckpts) == ckpts / "000020"
    assert os.readlink(ckpts / "last") == "000020"  # relative, so the run directory can be moved
    # `last` wins over the highest number: a resume from an older step abandons newer ones
    assert latest_checkpoint(tmp_path / "run") == ckpts / "000020"


def test_latest_without_last_and_without_anything(tmp_path):
    ckpts = _fake_run(tmp_path, [3, 10])
    assert read_last(ckpts) is None
    assert latest_checkpoint(tmp_path / "run") == ckpts / "000010"
    with pytest.raises(
        CheckpointNotFoundError, match="does not exist: no checkpoint has been committed.*000010"
    ):
        resolve_last(ckpts)
    assert latest_checkpoint(tmp_path / "empty") is None


def test_dangling_last_is_reported_and_latest_falls_back(tmp_path):
    ckpts = _fake_run(tmp_path, [3], last=7)
    assert read_last(ckpts) is None
    with pytest.raises(CheckpointNotFoundError, match="points to 000007, which does not exist"):
        resolve_last(ckpts)
    assert latest_checkpoint(tmp_path / "run") == ckpts / "000003"


def test_every_accepted_resume_path_names_the_step_dir(tmp_path):
    ckpts = _fake_run(tmp_path, [10, 20], last=20)
    step = (ckpts / "000020").resolve()
    for given in (
        step / "pretrained_model" / "train_config.json",
        step / "pretrained_model",
        step,
        ckpts / "last",
        ckpts / "last" / "pretrained_model" / "train_config.json",
        ckpts,
        tmp_path / "run",
    ):
        assert resolve_checkpoint_dir(given) == step, given
    assert resolve_checkpoint_dir(str(ckpts / "000010")) == (ckpts / "000010").resolve()


def _point_last(ckpts: Path, target: str) -> None:
    (ckpts / "last").unlink()
    os.symlink(target, ckpts / "last")


@pytest.mark.parametrize(
    "target",
    [
        "absolute other run",  # another run's checkpoint, by an absolute path
        "../../other/checkpoints/000007",  # the same, by ../
        "symlinked sibling",  # a name beside it that is itself a symlink to the other run
        "..",  # not a step directory at all
    ],
)
def test_a_last_pointing_outside_its_checkpoints_dir_is_refused(tmp_path, target):
    """Followed before, so a copied or downloaded run resumed (and trained on) whatever it named."""
    ckpts = _fake_run(tmp_path, [3, 5], last=5)
    other = _fake_run(tmp_path / "x", [7]).parent.parent  # tmp_path/x/run
    (tmp_path / "other").symlink_to(other / "run", target_is_directory=True)
    if target == "absolute other run":
        target = str(other / "run" / "checkpoints" / "000007")
    elif target == "symlinked sibling":
        os.symlink(other / "run" / "checkpoints" / "000007", ckpts / "000009")
        target = "000009"
    _point_last(ckpts, target)
    pattern = rf"{ckpts / 'last'} points to .*which is not a step directory of {ckpts}"
    for call in (
        lambda: read_last(ckpts),
        lambda: resolve_last(ckpts),
        lambda: latest_checkpoint(tmp_path / "run"),
        lambda: resolve_checkpoint_dir(tmp_path / "run"),
        lambda: resolve_checkpoint_dir(ckpts / "last"),
        lambda: resolve_checkpoint_dir(ckpts / "last" / "pretrained_model" / "train_config.json"),
    ):
        with pytest.raises(UnsafeCheckpointError, match=pattern):
            call()


def test_a_last_naming_its_sibling_stays_valid_however_it_is_written(tmp_path):
    ckpts = _fake_run(tmp_path, [3, 5], last=5)
    for target in ("000005", str(ckpts / "000005"), "./000005"):
        _point_last(ckpts, target)
        assert read_last(ckpts).resolve() == (ckpts / "000005").resolve(), target
        assert resolve_checkpoint_dir(ckpts / "last") == (ckpts / "000005").resolve(), target


def test_bad_resume_paths(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        resolve_checkpoint_dir(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(CheckpointNotFoundError, match="is not a checkpoint"):
        resolve_checkpoint_dir(tmp_path / "plain")
    (tmp_path / "stray.json").write_text("{}")
    with pytest.raises(CheckpointNotFoundError, match="outside a checkpoint"):
        resolve_checkpoint_dir(tmp_path / "stray.json")
    os.symlink("gone", tmp_path / "link")
    with pytest.raises(CheckpointNotFoundError, match="symlink to gone"):
        resolve_checkpoint_dir(tmp_path / "link")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint has been committed"):
        resolve_checkpoint_dir(tmp_path / "run")


def test_import_is_torch_free_and_paths_resolve_without_torch(tmp_path):
    import subprocess
    import sys

    _fake_run(tmp_path, [4], last=4)
    code = (
        "import sys, lerobot_ckpt as c; print(c.resolve_checkpoint_dir(sys.argv[1]).name); "
        "print(sorted(m for m in ('torch', 'numpy', 'safetensors') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["000004", "[]"]


def test_every_public_name_resolves():
    import lerobot_ckpt

    assert all(getattr(lerobot_ckpt, name) is not None for name in lerobot_ckpt.__all__)
    assert set(lerobot_ckpt._LAZY) <= set(lerobot_ckpt.__all__)
