"""No symlink inside a checkpoint's layout is followed: not a step directory, ``pretrained_model/``,
``training_state/``, a shard directory, nor a file in them.

The rule for names read from files (test_ckpt_dcp_paths.py) used to hold for files only: the converter
resolved ``--checkpoint_dir`` whole, so ``checkpoints/000002/pretrained_model -> <another run>/…``
(or ``checkpoints/000002 -> <another run's step>``) made ``lerobot-convert-dcp --delete_dcp`` write
that run's ``model.safetensors`` and delete its shards (exit 0), and a symlinked
``pytorch_model_fsdp_0/`` made it convert another run's shards as this one's. Each case must now end
with exit 2, one line naming the symlink, and nothing of either run changed. A user's own storage
layout above the run (a symlinked output directory or ``checkpoints/``) still converts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lerobot_ckpt.convert.cli import main
from lerobot_ckpt.dcp.index import DcpIndex
from lerobot_ckpt.paths import LinkedLayoutError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted import MODEL_DCP, save_weights
from test_ckpt_dcp_paths import PROG, tree

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def runs(tmp_path):
    """(ours, theirs): two run directories with one DCP checkpoint each (``checkpoints/000002``,
    ``last`` pointing at it); the test plants a symlink in ours."""
    out = []
    for seed, name in enumerate(("ours", "theirs")):
        step = save_weights(tmp_path / name / "checkpoints" / "000002", seed)
        (step / "training_state").mkdir()
        (step.parent / "last").symlink_to("000002")
        out.append(tmp_path / name)
    return tuple(out)


def _refused(capsys, argv: list[str], link: Path) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(PROG) and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{link} is a symlink" in err, err
    return err


def _replace_with_link(path: Path, target: Path) -> None:
    import shutil

    shutil.rmtree(path)
    path.symlink_to(target)


@pytest.mark.parametrize(
    "given", ["checkpoints/last/pretrained_model", "checkpoints/last", "checkpoints/000002"]
)
def test_a_symlinked_pretrained_model_is_neither_written_nor_deleted(runs, capsys, tmp_path, given):
    ours, theirs = runs
    link = ours / "checkpoints/000002/pretrained_model"
    _replace_with_link(link, theirs / "checkpoints/000002/pretrained_model")
    before = tree(tmp_path)
    _refused(capsys, [f"--checkpoint_dir={ours / given}", "--delete_dcp"], link)
    assert tree(tmp_path) == before  # their shards are there, no model.safetensors written


@pytest.mark.parametrize("given", ["checkpoints/000002", "checkpoints/000002/pretrained_model"])
def test_a_symlinked_step_directory_is_neither_written_nor_deleted(runs, capsys, tmp_path, given):
    ours, theirs = runs
    link = ours / "checkpoints/000002"
    _replace_with_link(link, theirs / "checkpoints/000002")
    before = tree(tmp_path)
    _refused(capsys, [f"--checkpoint_dir={ours / given}", "--delete_dcp"], link)
    assert tree(tmp_path) == before


def test_a_symlinked_shard_directory_is_not_read(runs, capsys, tmp_path):
    ours, theirs = runs
    link = ours / "checkpoints/000002" / MODEL_DCP
    _replace_with_link(link, theirs / "checkpoints/000002" / MODEL_DCP)
    before = tree(tmp_path)
    _refused(capsys, [f"--checkpoint_dir={ours / 'checkpoints/last'}"], link)
    assert tree(tmp_path) == before
    with pytest.raises(LinkedLayoutError, match="is a symlink"):
        DcpIndex.read(link)


@pytest.mark.parametrize("linked", ["run", "checkpoints"])
def test_a_users_own_symlinked_run_or_checkpoints_directory_still_converts(runs, capsys, tmp_path, linked):
    """The path up to the run directory is the user's storage layout, symlinks included."""
    ours, _ = runs
    if linked == "run":
        alias = tmp_path / "alias"
        alias.symlink_to(ours)
        given = alias / "checkpoints/last"
    else:
        real = tmp_path / "elsewhere"
        (ours / "checkpoints").rename(real)
        (ours / "checkpoints").symlink_to(real)
        given = ours / "checkpoints/000002"
    assert main([f"--checkpoint_dir={given}", "--delete_dcp"]) == 0, capsys.readouterr().err
    assert (ours / "checkpoints/000002/pretrained_model/model.safetensors").is_file()
    assert not (ours / "checkpoints/000002" / MODEL_DCP).exists()
