"""Random crafted ``.metadata`` files: the converter reads and writes only inside the checkpoint, never
ends in a traceback, and either refuses (exit 2, one line) or writes exactly the honest conversion.

Each case starts from a real checkpoint written by torch's ``dcp.save`` (``ours``), next to a second one
with other weights (``theirs``, what an attacker would make us read), and applies one to three edits
drawn by a seeded generator (hypothesis is not in the lock): a ``relative_path`` that is absolute, has
``..``, ``.``, a NUL, a backslash, ``~``, is empty, not a string, names a directory, a symlink to their
shard or to our own, a nested directory that is a symlink, or a nested directory that is real (valid);
a byte offset or length that is negative, huge, shifted, another record's, not an integer; a chunk
offset or size outside its tensor; a tensor shape that is negative or huge; a dtype other than the
record's; a chunk stored twice; a
shard replaced by a symlink, deleted or truncated; ``.metadata`` itself a symlink to theirs.

The converter runs in-process (``main([...])``) under a ``sys.addaudithook`` that records every open,
rename, remove, mkdir, symlink, chmod, truncate and directory listing: reads must resolve inside the
step directory (a path opened with ``O_NOFOLLOW`` counts as its own name, since a symlink there fails
to open), writes too. Every tensor of the model has a shape of its own, so a record read in place of
another is always refused rather than converted: "equal to the honest conversion" is exact.
"""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch
from lerobot_ckpt.convert.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crafted import MODEL_DCP, duplicate_storage, save_weights

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

PROG = "lerobot-convert-dcp: error: "
CASES = 300
SEED = 31
OUTPUT = "pretrained_model/model.safetensors"

_READS = {"os.listdir", "os.scandir"}
_WRITES = {
    "os.rename",
    "os.remove",
    "os.rmdir",
    "os.mkdir",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.chmod",
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CODE = tuple(
    {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, Path(torch.__file__).parents[1])}
    | {"/proc/", "/sys/", "/dev/"}
)


class _Watch:
    """Every file-system event of the code under test, judged against one directory."""

    def __init__(self) -> None:
        self.inside: str | None = None
        self.violations: list[str] = []

    def __call__(self, event: str, args: tuple) -> None:
        if self.inside is None:
            return
        if event == "open":
            path, mode, flags = args
            write = bool((flags or 0) & _WRITE_FLAGS) or (mode is not None and any(c in mode for c in "wax+"))
            self._judge(event, path, write=write, nofollow=bool((flags or 0) & os.O_NOFOLLOW))
        elif event in _READS:
            self._judge(event, args[0], write=False, nofollow=False)
        elif event in _WRITES:
            for path in args[:2] if event in ("os.rename", "os.symlink", "os.link") else args[:1]:
                self._judge(event, path, write=True, nofollow=True)
        elif event == "shutil.rmtree":
            self._judge(event, args[0], write=True, nofollow=True)

    def _judge(self, event: str, path: object, *, write: bool, nofollow: bool) -> None:
        if isinstance(path, int) or path is None:
            return  # a descriptor already judged when it was opened
        name = os.path.abspath(os.fsdecode(path))
        head, tail = os.path.split(name)
        real = os.path.join(os.path.realpath(head), tail) if nofollow else os.path.realpath(name)
        if real == self.inside or real.startswith(self.inside + os.sep):
            return
        if not write and (real.startswith(_CODE) or real.endswith((".py", ".pyc", ".so"))):
            return  # imports
        if write and "__pycache__" in real:
            return
        self.violations.append(f"{event} {'write' if write else 'read'} {name} -> {real}")


_WATCH = _Watch()
sys.addaudithook(_WATCH)  # hooks cannot be removed: it is idle unless a case sets `inside`


def _digest(root: Path, skip: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path == skip or skip in path.parents:
            continue
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(ours, theirs, the honest conversion of ours)."""
    root = tmp_path_factory.mktemp("crafted-metadata")
    ours = save_weights(root / "base" / "ours" / "000002", 0)
    theirs = save_weights(root / "theirs" / "000002", 1)
    honest = root / "honest" / "000002"
    shutil.copytree(ours, honest)
    assert main([f"--checkpoint_dir={honest}"]) == 0  # also imports what the converter imports lazily
    return root, ours, theirs, (honest / OUTPUT).read_bytes()


# --- the edits: each takes (rng, metadata, step, theirs) and changes the metadata and/or the files ----


def _entries(metadata):
    return list(metadata.storage_data.items())


def _one(rng, metadata):
    return rng.choice(_entries(metadata))


def _path_edit(rng, metadata, step, theirs):
    _, info = _one(rng, metadata)
    shards = step / MODEL_DCP
    name = info.relative_path
    choice = rng.randrange(22)
    if choice == 0:
        info.relative_path = str(theirs / MODEL_DCP / name)
    elif choice == 1:
        info.relative_path = "/etc/hostname"
    elif choice == 2:
        info.relative_path = "../" * rng.randint(1, 6) + f"theirs/000002/{MODEL_DCP}/{name}"
    elif choice == 3:
        info.relative_path = f"sub/../{name}"
    elif choice == 4:
        info.relative_path = f"./{name}"
    elif choice == 5:
        info.relative_path = f"{name}/"
    elif choice == 6:
        info.relative_path = rng.choice(["", "/", ".", "..", "//", "~", f"~/{name}"])
    elif choice == 7:
        info.relative_path = name[: rng.randint(0, len(name))] + "\x00" + name
    elif choice == 8:
        info.relative_path = "..\\..\\" + name
    elif choice == 9:
        info.relative_path = rng.choice([None, 3, b"__0_0.distcp", 1.5, ["__0_0.distcp"]])
    elif choice == 10:
        (shards / "adir").mkdir(exist_ok=True)
        info.relative_path = "adir"
    elif choice == 11:
        link = shards / "theirs.distcp"
        if not os.path.lexists(link):
            link.symlink_to(theirs / MODEL_DCP / name)
        info.relative_path = link.name
    elif choice == 12:
        link = shards / "alias.distcp"
        if not os.path.lexists(link):
            link.symlink_to(name)  # our own shard, by a symlink: still refused (no symlink is followed)
        info.relative_path = link.name
    elif choice == 13:
        link = shards / "linkdir"
        if not os.path.lexists(link):
            link.symlink_to(theirs / MODEL_DCP, target_is_directory=True)
        info.relative_path = f"linkdir/{name}"
    elif choice == 14:
        _nested(metadata, step, name)
    elif choice == 15:
        info.relative_path = "x" * rng.choice([255, 256, 5000])
    elif choice == 16:
        info.relative_path = "/proc/self/environ"
    elif choice == 17:
        info.relative_path = f"{theirs}/../../base/ours/000002/{MODEL_DCP}/{name}"
    elif choice == 18:
        info.relative_path = "missing.distcp"
    elif choice == 19:
        info.relative_path = f"a/b/c/{name}"
    elif choice == 20:
        info.relative_path = f"{name}\n"
    else:
        info.relative_path = name.upper()


def _nested(metadata, step: Path, name: str) -> None:
    """Valid: every entry of shard ``name`` names it inside a real subdirectory, where it now is."""
    shards = step / MODEL_DCP
    nested = shards / "nested"
    nested.mkdir(exist_ok=True)
    if (shards / name).is_file() and not (shards / name).is_symlink():
        shutil.copy2(shards / name, nested / name)
    for _, other in _entries(metadata):
        if other.relative_path == name:
            other.relative_path = f"nested/{name}"


def _valid_edit(rng, metadata, step, theirs):
    """An edit that changes nothing a reader sees: the conversion must be the honest one."""
    _, info = _one(rng, metadata)
    if rng.random() < 0.5 and isinstance(info.relative_path, str) and "/" not in info.relative_path:
        _nested(metadata, step, info.relative_path)
    else:  # the same values, written again
        info.offset, info.length = copy.copy(info.offset), copy.copy(info.length)


def _byte_edit(rng, metadata, step, theirs):
    _, info = _one(rng, metadata)
    field = rng.choice(["offset", "length"])
    old = getattr(info, field)
    old = old if isinstance(old, int) else 0  # an earlier edit may have made it anything
    _, other = _one(rng, metadata)
    value = rng.choice(
        [
            -1,
            -old - 1,
            -(2**63),
            2**63,
            2**64 + 1,
            10**30,
            0,
            old + rng.randint(1, 100),
            max(0, old - rng.randint(1, 100)),
            getattr(other, field),
            1.5,
            "12",
            True,
            None,
        ]
    )
    setattr(info, field, value)


def _overlap_edit(rng, metadata, step, theirs):
    """Two entries read the same bytes (one record in place of another)."""
    (_, a), (_, b) = rng.sample(_entries(metadata), 2)
    a.relative_path, a.offset, a.length = b.relative_path, b.offset, b.length


def _chunk_edit(rng, metadata, step, theirs):
    fqn = rng.choice(sorted(metadata.state_dict_metadata))
    entry = metadata.state_dict_metadata[fqn]
    chunk = entry.chunks[0]
    field = rng.choice(["offsets", "sizes"])
    values = list(getattr(chunk, field))
    i = rng.randrange(len(values))
    values[i] = rng.choice([-1, values[i] + 1, 2**40, -(2**62), 0])
    if rng.random() < 0.2:
        values.append(1)
    setattr(chunk, field, torch.Size(values))


def _shape_edit(rng, metadata, step, theirs):
    entry = metadata.state_dict_metadata[rng.choice(sorted(metadata.state_dict_metadata))]
    dims = list(entry.size)
    dims[0] = rng.choice([-1, 0, 2**40, dims[0] + 1])
    entry.size = torch.Size(dims)


def _dtype_edit(rng, metadata, step, theirs):
    entry = metadata.state_dict_metadata[rng.choice(sorted(metadata.state_dict_metadata))]
    entry.properties.dtype = rng.choice([torch.float16, torch.bfloat16, torch.float64, torch.int32])


def _duplicate_edit(rng, metadata, step, theirs):
    fqn, other = rng.sample(sorted(i.fqn for i in metadata.storage_data), 2)
    duplicate_storage(metadata, fqn, rng.choice([fqn, other]))


def _file_edit(rng, metadata, step, theirs):
    shards = step / MODEL_DCP
    shard = shards / "__0_0.distcp"
    choice = rng.randrange(4)
    if not shard.is_file() or shard.is_symlink():
        return
    if choice == 0:
        shard.unlink()
        shard.symlink_to(theirs / MODEL_DCP / shard.name)
    elif choice == 1:
        shard.unlink()
    elif choice == 2:
        with open(shard, "r+b") as f:
            f.truncate(rng.randint(0, shard.stat().st_size - 1))
    else:
        (shards / ".metadata.theirs").symlink_to(theirs / MODEL_DCP / ".metadata")  # applied after writing


EDITS = [
    _valid_edit,
    _path_edit,
    _path_edit,
    _byte_edit,
    _overlap_edit,
    _chunk_edit,
    _shape_edit,
    _dtype_edit,
    _duplicate_edit,
    _file_edit,
]


def _craft(rng: random.Random, case: Path, theirs: Path) -> list[str]:
    shards = case / MODEL_DCP
    metadata = pickle.loads((shards / ".metadata").read_bytes())  # our own test file, written by torch
    edits = [rng.choice(EDITS) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    for edit in edits:
        edit(rng, metadata, case, theirs)
    (shards / ".metadata").write_bytes(pickle.dumps(metadata))
    if os.path.lexists(shards / ".metadata.theirs"):
        os.replace(shards / ".metadata.theirs", shards / ".metadata")
    return [e.__name__ for e in edits]


def test_random_crafted_metadata_reads_and_writes_only_inside_and_ends_cleanly(base, capsys):
    root, ours, theirs, honest = base
    rng = random.Random(SEED)
    outcomes = {"refused": 0, "converted": 0}
    for n in range(CASES):
        case = root / "cases" / f"{n:03d}" / "000002"
        shutil.copytree(ours, case, symlinks=True)
        edits = _craft(rng, case, theirs)
        outside = _digest(root, case)
        _WATCH.inside, _WATCH.violations = os.path.realpath(case), []
        try:
            rc = main([f"--checkpoint_dir={case}"])
        except BaseException as exc:  # noqa: BLE001 - a traceback is the failure being looked for
            _WATCH.inside = None
            pytest.fail(f"case {n} {edits}: {type(exc).__name__}: {exc}")
        finally:
            _WATCH.inside = None
        err = capsys.readouterr().err
        where = f"case {n} {edits}: rc {rc}, {err!r}"
        assert not _WATCH.violations, f"{where}: {_WATCH.violations}"
        assert _digest(root, case) == outside, f"{where}: something outside the checkpoint changed"
        if rc == 2:
            assert err.startswith(PROG) and err.count("\n") == 1 and "Traceback" not in err, where
            assert not (case / OUTPUT).exists(), where
            outcomes["refused"] += 1
        else:
            assert rc == 0, where
            assert (case / OUTPUT).read_bytes() == honest, f"{where}: not the honest conversion"
            outcomes["converted"] += 1
        shutil.rmtree(case.parent)
    assert outcomes["refused"] > CASES // 2 and outcomes["converted"] > 0, outcomes
