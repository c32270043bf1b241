"""Checkpoints cross the torch versions lerobot-ckpt supports (2.11, LeRobot 0.6.1's, to 2.15, the lock).

``data/torch-<version>/`` holds an FSDP2 ×2 checkpoint lerobot-ckpt wrote under that torch
(``tools/make_torch_version_fixture.py``; DCP's ``.metadata`` pickles differ between them) and the
weights torch had. Every one must read in the running torch: the torch-free index and record checks,
the converter, and a resume into one process. ``.ci/run`` runs this file under torch 2.15 (the
workspace) and 2.11 (LeRobot's environment), so each direction is covered.
"""

import shutil
from pathlib import Path

import pytest
import torch
from lerobot_ckpt import TrainingObjects, convert_dcp, load_checkpoint
from lerobot_ckpt.dcp.index import DcpIndex
from lerobot_ckpt.dcp.untrusted import check_untrusted
from safetensors.torch import load_file
from torch import nn

DATA = Path(__file__).resolve().parent / "data"
FIXTURES = sorted(DATA.glob("torch-*"))

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_every_supported_torch_has_a_fixture():
    assert [p.name for p in FIXTURES] == ["torch-2.11.0", "torch-2.15.0"]


@pytest.fixture(params=FIXTURES, ids=lambda p: p.name)
def written(request, tmp_path):
    step = shutil.copytree(request.param / "checkpoints" / "000002", tmp_path / "000002")
    return step, load_file(str(request.param / "expected.safetensors"))


def test_the_index_and_record_checks_read_it(written):
    step, expected = written
    for directory in (
        step / "pretrained_model" / "pytorch_model_fsdp_0",
        step / "training_state" / "optimizer_0",
    ):
        index = DcpIndex.read(directory)
        index.check_files()
        index.check_records()
        check_untrusted(index)
    model = DcpIndex.read(step / "pretrained_model" / "pytorch_model_fsdp_0").under("model")
    assert {k: t.shape for k, t in model.items()} == {
        k: tuple(v.shape) for k, v in expected.items() if not k.startswith("exp_avg")
    }


def test_the_converter_merges_it_bitwise(written):
    step, expected = written
    convert_dcp(step)
    merged = load_file(str(step / "pretrained_model" / "model.safetensors"))
    assert merged.keys() == {k for k in expected if not k.startswith("exp_avg")}
    assert all(torch.equal(merged[k], expected[k]) for k in merged)


def test_a_resume_in_one_process_restores_it(written):
    step, expected = written
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    state = load_checkpoint(step, objects=TrainingObjects(model=model, optimizer=opt))
    assert state.step == 2 and state.sampler_state == {"offset": 8}
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    first = opt.state[model[0].weight]
    assert torch.equal(first["exp_avg"], expected["exp_avg.0.weight"]) and int(first["step"]) == 2
    assert opt.param_groups[0]["lr"] == 1e-2 and opt.param_groups[0]["weight_decay"] == 0.1
