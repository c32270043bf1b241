"""The torch-free ``.metadata`` reader: same index as torch's own unpickling, nothing else accepted,
and a converter that never imports torch on its default path.

Checkpoints are written by ``torch.distributed.checkpoint`` in this process (single-process
``no_dist`` saves); the multi-rank shards of real FSDP2/HSDP runs go through the same reader in
tests/test_ckpt_sharded_resume.py.
"""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from lerobot_ckpt._dtypes import ALIASES, DTYPES, by_name, dtype_of
from lerobot_ckpt.dcp.index import DcpIndex
from lerobot_ckpt.dcp.metadata import load_metadata
from lerobot_ckpt.errors import CorruptCheckpointError, UnsupportedCheckpointError
from lerobot_ckpt.safetensors.stream import dtype_code
from safetensors.torch import load_file

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
SCRIPT = str(Path(sys.executable).parent / "lerobot-convert-dcp")


def _mixed_state():
    g = torch.Generator().manual_seed(0)
    return {
        "model": {
            "f32": torch.randn(7, 5, generator=g),
            "bf16": torch.randn(3, 7, generator=g).to(torch.bfloat16),
            "f16": torch.randn(4, generator=g).to(torch.float16),
            "f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
            "f8": torch.randn(8, generator=g).to(torch.float8_e4m3fn),
            "c64": torch.randn(3, generator=g, dtype=torch.complex64),
            "i64": torch.tensor(12),
            "u8": torch.arange(6, dtype=torch.uint8).reshape(2, 3),
            "mask": torch.tensor([True, False]),
            "empty": torch.zeros(0, 4),
            "channels_last": torch.randn(1, 2, 3, 3, generator=g).to(memory_format=torch.channels_last),
            "count": 5,
            "name": "policy",
            "nothing": None,
            "nested": [1, torch.ones(2)],
        },
        "optimizer": {
            "state": {"f32": {"step": torch.tensor(3.0), "exp_avg": torch.zeros(7, 5)}},
            "param_groups": [{"lr": 0.1, "params": ["f32"]}],
        },
    }


def _save(directory: Path, state) -> Path:
    dcp.save(state, storage_writer=dcp.FileSystemWriter(directory), no_dist=True)
    return directory


NEWER_THAN_2_11 = {"bcomplex32"}  # dtypes torch 2.11 (LeRobot 0.6.1's) does not define yet


def test_dtype_table_is_torchs():
    """Every torch dtype has an entry with its element size and kind; the safetensors codes are
    safetensors' own."""
    from safetensors.torch import _TYPES

    canonical = {
        n
        for n in dir(torch)
        if isinstance(getattr(torch, n), torch.dtype) and str(getattr(torch, n)) == f"torch.{n}"
    }
    # The table spans every torch the package supports (2.11 to 2.15): the running one may lack newer dtypes.
    assert canonical <= set(DTYPES) and set(DTYPES) - canonical <= NEWER_THAN_2_11
    for name in canonical:
        real, ours = getattr(torch, name), DTYPES[name]
        assert (ours.itemsize, ours.is_floating_point, ours.torch) == (
            real.itemsize,
            real.is_floating_point,
            real,
        )
        assert dtype_of(real) is ours and dtype_of(name) is ours and str(ours) == str(real)
        if ours.code is not None:
            assert _TYPES[ours.code] is real and dtype_code(real) == dtype_code(ours) == ours.code
    for alias, name in ALIASES.items():
        assert getattr(torch, alias) is getattr(torch, name) and by_name(alias) is DTYPES[name]


def test_stand_in_parse_equals_torch_parse(tmp_path):
    directory = _save(tmp_path / "dcp", _mixed_state())
    ours = DcpIndex.read(directory)
    with open(directory / ".metadata", "rb") as f:
        torchs = DcpIndex.from_metadata(directory, pickle.load(f))  # torch's classes, torch's unpickler
    assert ours == torchs
    by_path = {t.path: t for t in ours.tensors}
    state = _mixed_state()
    for key, value in state["model"].items():
        if isinstance(value, torch.Tensor):
            stored = by_path["model", key]
            assert (stored.dtype.torch, stored.shape, stored.nbytes) == (
                value.dtype,
                tuple(value.shape),
                value.numel() * value.element_size(),
            )
    assert by_path["model", "nested", 1].shape == (2,)
    assert {
        ("model", "count"),
        ("model", "name"),
        ("model", "nothing"),
        ("model", "nested", 0),
        ("optimizer", "param_groups", 0, "lr"),
    } <= set(ours.other_paths)
    assert ours.under("optimizer")["state.f32.exp_avg"].shape == (7, 5)


def test_stand_in_fields_match_torchs_objects(tmp_path):
    """Field by field, including the deprecated ones (layout, memory format code) and the strides."""
    directory = _save(tmp_path / "dcp", _mixed_state())
    ours = load_metadata(directory / ".metadata")
    with open(directory / ".metadata", "rb") as f:
        real = pickle.load(f)
    assert ours.planner_data == real.planner_data and ours.version == real.version
    assert set(ours.state_dict_metadata) == set(real.state_dict_metadata)
    for key, entry in real.state_dict_metadata.items():
        mine = ours.state_dict_metadata[key]
        assert type(mine).__name__ == type(entry).__name__, key
        if hasattr(entry, "properties"):
            assert str(mine.properties.dtype) == str(entry.properties.dtype)
            assert mine.properties.strides == getattr(entry.properties, "strides", None)  # torch ≥ 2.12
            assert mine.properties.layout == str(entry.properties.layout)
            assert mine.size == tuple(entry.size)
            assert [(c.offsets, c.sizes) for c in mine.chunks] == [
                (tuple(c.offsets), tuple(c.sizes)) for c in entry.chunks
            ]
    assert {
        (i.fqn, i.offset): (s.relative_path, s.offset, s.length) for i, s in ours.storage_data.items()
    } == {
        (i.fqn, None if i.offset is None else tuple(i.offset)): (s.relative_path, s.offset, s.length)
        for i, s in real.storage_data.items()
    }


class _RunsCode:
    def __reduce__(self):
        return os.system, ("touch PWNED",)


def test_unknown_globals_are_refused_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "dcp"
    directory.mkdir()
    (directory / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    with pytest.raises(
        UnsupportedCheckpointError,
        match=r"refers to (posix|os)\.system, which lerobot-ckpt's "
        "metadata reader does not know",
    ):
        DcpIndex.read(directory)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a pickle at all", "not readable DCP metadata"),
        (pickle.dumps({"state_dict_metadata": {}}), "expected DCP Metadata, found dict"),
        (b"", "not readable DCP metadata: EOFError"),
    ],
)
def test_garbage_metadata_is_corrupt(tmp_path, content, message):
    directory = tmp_path / "dcp"
    directory.mkdir()
    (directory / ".metadata").write_bytes(content)
    with pytest.raises(CorruptCheckpointError, match=message):
        DcpIndex.read(directory)


def test_truncated_metadata_is_corrupt(tmp_path):
    directory = _save(tmp_path / "dcp", _mixed_state())
    data = (directory / ".metadata").read_bytes()
    (directory / ".metadata").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpointError, match="not readable DCP metadata"):
        DcpIndex.read(directory)


WITHOUT_TORCH = r"""
import sys
from lerobot_ckpt.convert.cli import main
code = main(sys.argv[1:])
print(code, sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def _step(root: Path, state) -> Path:
    pm = root / "checkpoints" / "000010" / "pretrained_model"
    pm.mkdir(parents=True)
    _save(pm / "pytorch_model_fsdp_0", {"model": state})
    return pm.parent


@pytest.mark.parametrize("flags", [[], ["--delete_dcp=true"]])
def test_the_converter_never_imports_torch_unless_casting(tmp_path, flags):
    """Converting (and, with --delete_dcp, verifying) tensors of every common dtype in a fresh
    process leaves ``torch`` out of ``sys.modules``; the output equals the tensors bitwise. (A
    channels_last tensor is stored with its strides: only ``torch.load`` rebuilds it, so it is left out.)"""
    state = {
        k: v
        for k, v in _mixed_state()["model"].items()
        if isinstance(v, torch.Tensor) and k != "channels_last"
    }
    step = _step(tmp_path, state)
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, f"--checkpoint_dir={step}", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0 []"
    out = load_file(step / "pretrained_model" / "model.safetensors")
    assert out.keys() == state.keys()
    for k, v in state.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape, k
        assert torch.equal(out[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k
    assert (step / "pretrained_model" / "pytorch_model_fsdp_0").exists() == (not flags)


def test_the_installed_script_imports_no_torch(tmp_path):
    """The console script itself, seen through ``-X importtime`` (PYTHONPROFILEIMPORTTIME)."""
    step = _step(tmp_path, {"w": torch.randn(16, 4), "b": torch.randn(4).bfloat16()})
    proc = subprocess.run(
        [SCRIPT, f"--checkpoint_dir={step}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert {"lerobot_ckpt.convert.merge", "lerobot_ckpt.dcp.metadata", "lerobot_ckpt.dcp.raw"} <= imported
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}
