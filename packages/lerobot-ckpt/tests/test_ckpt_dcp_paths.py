"""A DCP checkpoint is read only inside itself: the file names ``.metadata`` gives are checked before a
byte of them is read.

Each chunk's ``relative_path`` used to be joined to the shard directory as it was, so a ``.metadata``
naming an absolute path or ``../`` (even with no shard file left in the checkpoint), or a shard file
that is a symlink, made ``lerobot-convert-dcp`` write *another* checkpoint's weights as
``model.safetensors`` (exit 0, byte-equal to that model's own conversion). Every case below is such an
edit of a checkpoint torch's own ``dcp.save`` wrote, next to a second checkpoint ("theirs") it points
at; each must end with exit 2, one line naming ``.metadata`` (or the shard directory) and the entry,
nothing written and nothing of theirs read. The random edits are in test_ckpt_dcp_crafted_metadata.py;
the resume and the torch reader in test_ckpt_untrusted.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lerobot_ckpt.convert.cli import main
from lerobot_ckpt.dcp.index import DcpIndex
from lerobot_ckpt.paths import UnsafePathError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted import MODEL_DCP, duplicate_storage, edit_metadata, save_weights, set_storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

MODEL = MODEL_DCP
PROG = "lerobot-convert-dcp: error: "


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: file digests, link targets, directories."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[key] = "dir" if path.is_dir() else "other"
    return out


@pytest.fixture
def pair(tmp_path):
    """(ours, theirs): two checkpoints with different weights; ours is the one crafted."""
    return save_weights(tmp_path / "ours" / "000002", 0), save_weights(tmp_path / "theirs" / "000002", 1)


def _delete_shards(step: Path) -> None:
    for shard in (step / MODEL).glob("*.distcp"):
        shard.unlink()


def _absolute(ours: Path, theirs: Path) -> str:
    edit_metadata(ours / MODEL, lambda m: set_storage(m, "relative_path", lambda p: str(theirs / MODEL / p)))
    _delete_shards(ours)  # it works without a shard file of its own
    return "is an absolute path"


def _dotdot(ours: Path, theirs: Path) -> str:
    edit_metadata(
        ours / MODEL,
        lambda m: set_storage(m, "relative_path", lambda p: f"../../../../theirs/000002/{MODEL}/{p}"),
    )
    _delete_shards(ours)
    return "is not a plain relative path (it has '..'"


def _symlinked_shard(ours: Path, theirs: Path) -> str:
    for shard in (ours / MODEL).glob("*.distcp"):
        shard.unlink()
        shard.symlink_to(theirs / MODEL / shard.name)
    return "is a symlink"


def _symlinked_dir(ours: Path, theirs: Path) -> str:
    (ours / MODEL / "sub").symlink_to(theirs / MODEL)
    edit_metadata(ours / MODEL, lambda m: set_storage(m, "relative_path", lambda p: f"sub/{p}"))
    return "is a symlink"


def _nul(ours: Path, theirs: Path) -> str:
    edit_metadata(ours / MODEL, lambda m: set_storage(m, "relative_path", lambda p: f"{p}\x00.txt"))
    return "holds a NUL byte"


def _newline(ours: Path, theirs: Path) -> str:
    """A control character: the name would split the one-line message (found by the random test)."""
    edit_metadata(ours / MODEL, lambda m: set_storage(m, "relative_path", lambda p: f"{p}\n"))
    return "a control character"


def _directory(ours: Path, theirs: Path) -> str:
    (ours / MODEL / "sub").mkdir()
    edit_metadata(ours / MODEL, lambda m: set_storage(m, "relative_path", "sub"))
    return "which is not a regular file"


def _fifo(ours: Path, theirs: Path) -> str:
    os.mkfifo(ours / MODEL / "pipe")
    edit_metadata(ours / MODEL, lambda m: set_storage(m, "relative_path", "pipe"))
    return "which is not a regular file"


CRAFTS = {
    "absolute path": _absolute,
    "../ path": _dotdot,
    "symlinked shard file": _symlinked_shard,
    "symlinked directory": _symlinked_dir,
    "NUL byte": _nul,
    "newline": _newline,
    "a directory": _directory,
    "a FIFO": _fifo,
}


def _one_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(PROG) and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("name", list(CRAFTS))
def test_a_name_outside_the_shard_directory_is_refused_before_reading(pair, capsys, name):
    ours, theirs = pair
    why = CRAFTS[name](ours, theirs)
    before = tree(ours.parent.parent)
    fifo = ours / MODEL / "pipe"
    keeper = os.open(fifo, os.O_RDWR | os.O_NONBLOCK) if fifo.exists() else None  # no hang if opened
    try:
        err = _one_line(capsys, [f"--checkpoint_dir={ours}"])
    finally:
        if keeper is not None:
            os.close(keeper)
    assert f"{ours / MODEL / '.metadata'}: the relative_path of model." in err, err
    assert why in err and "it was not read" in err, err
    assert tree(ours.parent.parent) == before  # nothing written, theirs untouched
    assert not (ours / "pretrained_model" / "model.safetensors").exists()


def test_a_symlinked_metadata_file_is_refused(pair, capsys):
    ours, theirs = pair
    (ours / MODEL / ".metadata").unlink()
    (ours / MODEL / ".metadata").symlink_to(theirs / MODEL / ".metadata")
    err = _one_line(capsys, [f"--checkpoint_dir={ours}"])
    assert f"{ours / MODEL}: its DCP metadata file = '.metadata' is a symlink" in err, err
    assert not (ours / "pretrained_model" / "model.safetensors").exists()


def test_a_nested_name_inside_the_directory_still_converts(pair, tmp_path, capsys):
    """The rule is not "no slash": a plain relative path inside the directory reads as before."""
    ours, _ = pair
    honest = save_weights(tmp_path / "honest" / "000002", 0)
    assert main([f"--checkpoint_dir={honest}"]) == 0
    (ours / MODEL / "sub").mkdir()
    for shard in (ours / MODEL).glob("*.distcp"):
        shard.rename(ours / MODEL / "sub" / shard.name)
    edit_metadata(ours / MODEL, lambda m: set_storage(m, "relative_path", lambda p: f"sub/{p}"))
    assert main([f"--checkpoint_dir={ours}"]) == 0
    written = (ours / "pretrained_model" / "model.safetensors").read_bytes()
    assert written == (honest / "pretrained_model" / "model.safetensors").read_bytes()


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("offset", -5, "the record of model.0.weight has a bad byte offset: -5 is negative"),
        ("length", -1, "the record of model.0.weight has a bad byte length: -1 is negative"),
        ("offset", "12", "the record of model.0.weight has the byte offset '12', which is not an integer"),
    ],
)
def test_a_negative_byte_offset_is_a_bad_offset(pair, capsys, field, value, match):
    """Not "needs torch" (a torch-free converter fell back to decoding it) nor torch's EINVAL."""
    ours, _ = pair
    edit_metadata(ours / MODEL, lambda m: set_storage(m, field, value, fqn="model.0.weight"))
    err = _one_line(capsys, [f"--checkpoint_dir={ours}"])
    assert f"{ours / MODEL / '.metadata'}: {match}" in err, err
    assert "needs torch" not in err and "Errno" not in err


def test_a_negative_byte_offset_is_a_bad_offset_without_torch(pair):
    """Where torch is not installed the converter used to fall back to decoding the record and say
    it "needs torch"; the offset is what is wrong."""
    ours, _ = pair
    edit_metadata(ours / MODEL, lambda m: set_storage(m, "offset", -5, fqn="model.0.weight"))
    code = (
        "import sys; sys.modules['torch'] = None; from lerobot_ckpt.convert.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, f"--checkpoint_dir={ours}"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "has a bad byte offset: -5 is negative" in res.stderr, res.stderr
    assert "needs torch" not in res.stderr


def _chunk(metadata, fqn: str):
    return metadata.state_dict_metadata[fqn].chunks[0]


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: setattr(_chunk(m, "model.0.bias"), "offsets", torch.Size([-1])), r"offsets \(-1,\)"),
        (lambda m: setattr(_chunk(m, "model.0.bias"), "sizes", torch.Size([8])), r"sizes \(8,\)"),
        (lambda m: setattr(_chunk(m, "model.0.bias"), "sizes", torch.Size([7, 1])), r"sizes \(7, 1\)"),
    ],
)
def test_a_chunk_outside_its_tensor_is_refused(pair, capsys, edit, match):
    ours, _ = pair
    edit_metadata(ours / MODEL, edit)
    err = _one_line(capsys, [f"--checkpoint_dir={ours}"])
    assert "a chunk of model.0.bias claims" in err and "do not lie inside its shape (7,)" in err, err
    assert re.search(match, err), err


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_a_dtype_other_than_the_records_is_refused(pair, capsys, dtype):
    """The converter decoded the float32 record and wrote it cast to the dtype the metadata claimed
    (exit 0, a model.safetensors with one tensor silently in float16)."""
    ours, _ = pair

    def claim(metadata):
        metadata.state_dict_metadata["model.0.bias"].properties.dtype = dtype

    edit_metadata(ours / MODEL, claim)
    err = _one_line(capsys, [f"--checkpoint_dir={ours}"])
    name = str(dtype).removeprefix("torch.")
    assert f"0.bias: stored chunk is float32, the metadata says {name}" in err, err
    assert not (ours / "pretrained_model" / "model.safetensors").exists()


def test_a_chunk_stored_twice_is_refused(pair, capsys):
    """Which of two entries for one chunk a reader took would depend on the reader."""
    ours, _ = pair
    edit_metadata(ours / MODEL, lambda m: duplicate_storage(m, "model.0.bias", "model.2.bias"))
    err = _one_line(capsys, [f"--checkpoint_dir={ours}"])
    assert "the chunk of model.0.bias at (0,) has two storage entries" in err, err


def test_the_index_refuses_a_bad_name_without_touching_the_disk(pair):
    """``DcpIndex.read`` refuses the name itself (``check_name``): no file named is even looked at."""
    ours, theirs = pair
    _absolute(ours, theirs)
    with pytest.raises(UnsafePathError, match="is an absolute path"):
        DcpIndex.read(ours / MODEL)
