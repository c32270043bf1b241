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

import shutil
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


# --- resume: lerobot_ckpt.load_checkpoint / resolve_checkpoint_dir -------------------------------------


def _tiny(seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2)


@pytest.fixture
def resumable(tmp_path):
    """(ours, theirs): two runs with a whole-file checkpoint at step 2 (and ``last``) each, different
    weights; a ``train_config.json`` beside the weights as the CLI writes it."""
    from lerobot_ckpt import RunInfo, TrainingObjects, save_checkpoint

    out = []
    for seed, name in enumerate(("ours", "theirs")):
        model, opt, sched = _tiny(seed)
        step = save_checkpoint(
            tmp_path / name,
            2,
            run=RunInfo(world_size=1, batch_size=2),
            objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
        )
        train_config = step / "pretrained_model" / "train_config.json"
        if not train_config.exists():
            train_config.write_text(f'{{"output_dir": "{tmp_path / name}"}}')
        out.append(tmp_path / name)
    return tuple(out)


def _load(checkpoint: Path):
    from lerobot_ckpt import TrainingObjects, load_checkpoint

    model, opt, sched = _tiny(9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        return load_checkpoint(
            checkpoint, objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched)
        )
    finally:
        if sys.exc_info()[0] is not None:  # refused: nothing of the model changed
            assert all((before[k] == v).all() for k, v in model.state_dict().items())


STEP = "checkpoints/000002"
RESUME_FILES = [
    "training_state/optimizer_state.safetensors",
    "training_state/rng_state.safetensors",
    "training_state/training_step.json",
    "training_state/optimizer_param_groups.json",
    "training_state/scheduler_state.json",
    "pretrained_model/model.safetensors",
    "pretrained_model/train_config.json",
    "training_state",
    "pretrained_model",
]


@pytest.mark.parametrize("name", RESUME_FILES)
def test_a_resume_reads_no_file_or_directory_linked_out_of_the_checkpoint(resumable, name):
    """Each of these, a symlink to another run's, used to be read as this checkpoint's (exit 0)."""
    ours, theirs = resumable
    link = ours / STEP / name
    (shutil.rmtree if link.is_dir() else Path.unlink)(link)
    link.symlink_to(theirs / STEP / name)
    for given in (ours, ours / "checkpoints/last", ours / STEP / "pretrained_model/train_config.json"):
        with pytest.raises(LinkedLayoutError, match=f"{link} is a symlink"):
            _load(given)


@pytest.mark.parametrize(
    "given", [STEP, f"{STEP}/pretrained_model/train_config.json", f"{STEP}/pretrained_model"]
)
def test_a_symlinked_step_directory_is_not_resumed(resumable, given):
    """``checkpoints/000002 -> <their step>`` used to resolve to *their* step directory: the resume
    read their state and wrote its next checkpoints into their run."""
    from lerobot_ckpt.discovery import resolve_checkpoint_dir

    ours, theirs = resumable
    link = ours / STEP
    shutil.rmtree(link)
    link.symlink_to(theirs / STEP)
    with pytest.raises(LinkedLayoutError, match=f"{link} is a symlink"):
        resolve_checkpoint_dir(ours / given)


def test_a_symlinked_train_config_does_not_move_the_resume_into_another_run(resumable):
    from lerobot_ckpt.discovery import resolve_checkpoint_dir

    ours, theirs = resumable
    link = ours / STEP / "pretrained_model/train_config.json"
    link.unlink()
    link.symlink_to(theirs / STEP / "pretrained_model/train_config.json")
    with pytest.raises(LinkedLayoutError, match=f"{link} is a symlink"):
        resolve_checkpoint_dir(ours / "checkpoints/last/pretrained_model/train_config.json")


@pytest.mark.parametrize("linked", ["run", "checkpoints"])
def test_a_users_symlinked_run_directory_still_resumes_in_place(resumable, tmp_path, linked):
    """The run directory is the path the user named, not where its symlinks lead."""
    from lerobot_ckpt.discovery import resolve_checkpoint_dir

    ours, _ = resumable
    if linked == "run":
        run = tmp_path / "alias"
        run.symlink_to(ours)
    else:
        run = ours
        (ours / "checkpoints").rename(tmp_path / "storage")
        (ours / "checkpoints").symlink_to(tmp_path / "storage")
    given = run / "checkpoints/last/pretrained_model/train_config.json"
    assert resolve_checkpoint_dir(given) == run / STEP
    assert _load(given).step == 2
