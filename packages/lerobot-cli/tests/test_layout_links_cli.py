"""``--policy.path`` and ``--config_path`` follow no symlink inside a checkpoint's layout.

``--policy.path=pkg`` with ``pkg/pretrained_model -> <another model>`` used to train that other model
silently (each file of it passed the file-level rule), and ``--config_path=<run>/checkpoints/last/
pretrained_model/train_config.json`` with that file linked to another run's made the resume continue,
and write into, that run. Both are now one line naming the symlink (exit 2 through UsageError). A
Hugging Face cache snapshot, whose links stay inside its repository, and a user's own symlinked
directory above the layout, still work.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lerobot_cli.cli.errors import UsageError
from lerobot_cli.cli.paths import resolve_config_path, resolve_policy_dir


def _pretrained(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    (directory / "train_config.json").write_text("{}")
    return directory


def test_a_symlinked_pretrained_model_is_not_a_policy_path(tmp_path):
    secret = _pretrained(tmp_path / "secret" / "pretrained_model")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pretrained_model").symlink_to(secret)
    with pytest.raises(UsageError, match=r"pkg/pretrained_model is a symlink \(to .*secret"):
        resolve_policy_dir(str(tmp_path / "pkg"))
    assert resolve_policy_dir(str(tmp_path / "secret")) == tmp_path / "secret" / "pretrained_model"


def test_a_hub_snapshot_and_a_users_alias_still_resolve(tmp_path):
    repo = tmp_path / "hub" / "models--org--name"
    blob = _pretrained(repo / "blobs" / "pm")
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "pretrained_model").symlink_to(blob)
    assert resolve_policy_dir(str(snapshot)) == snapshot / "pretrained_model"
    run = tmp_path / "run"
    _pretrained(run / "pretrained_model")
    (tmp_path / "alias").symlink_to(run)  # the user's own link above the layout
    assert resolve_policy_dir(str(tmp_path / "alias")) == tmp_path / "alias" / "pretrained_model"


def _checkpoint(run: Path) -> Path:
    step = run / "checkpoints" / "000002"
    _pretrained(step / "pretrained_model")
    (step / "training_state").mkdir()
    (run / "checkpoints" / "last").symlink_to("000002")
    return step


@pytest.mark.parametrize("linked", ["pretrained_model/train_config.json", "pretrained_model", "step"])
def test_a_config_path_linked_into_another_run_is_refused(tmp_path, linked):
    ours, theirs = _checkpoint(tmp_path / "ours"), _checkpoint(tmp_path / "theirs")
    link = ours if linked == "step" else ours / linked
    if link.is_dir():
        import shutil

        shutil.rmtree(link)
    else:
        link.unlink()
    link.symlink_to(theirs if linked == "step" else theirs / linked)
    via = "000002" if linked == "step" else "last"  # `last` to a linked step is refused by its own check
    given = tmp_path / f"ours/checkpoints/{via}/pretrained_model/train_config.json"
    with pytest.raises(UsageError, match=f"{link} is a symlink"):
        resolve_config_path(str(given))


def test_a_checkpoints_own_config_path_resolves(tmp_path):
    _checkpoint(tmp_path / "ours")
    given = tmp_path / "ours/checkpoints/last/pretrained_model/train_config.json"
    assert resolve_config_path(str(given)) == given
