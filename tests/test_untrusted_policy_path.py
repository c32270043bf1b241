"""``lerobot-train --policy.path=<a directory someone sent>``: every crafted file ends the run in one line.

One real MLP run (and one PEFT run on it) is made once; each case copies it, edits one file the way an
attacker or a careless tool would, and runs ``lerobot-train`` on the copy in its own process, as a
user would. Each must exit 2 with one ``lerobot-train: error:`` line naming the file and the field,
no traceback, the copy unchanged and no output directory; a warning case trains and says so once.
Library-level cases of the same checks are in packages/lerobot-cli/tests/test_untrusted_pretrained.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
TRAIN = str(Path(sys.executable).parent / "lerobot-train")
DATA = ["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}", "--num_workers=0", "--log_freq=0"]
STEP = Path("checkpoints") / "000002" / "pretrained_model"


@pytest.fixture(scope="module")
def made(tmp_path_factory, launch) -> Path:
    """``base/`` (a 2-step MLP run) and ``peft/`` (a 2-step LoRA run on it)."""
    root = tmp_path_factory.mktemp("sent")
    res = launch.run_command(
        [
            TRAIN,
            *DATA,
            "--policy.type=mlp",
            "--policy.hidden_dim=32",
            "--steps=2",
            f"--output_dir={root / 'base'}",
        ],
        timeout_s=180,
    )
    assert res.returncode == 0, res.describe()
    res = launch.run_command(
        [
            TRAIN,
            *DATA,
            f"--policy.path={root / 'base' / STEP}",
            "--peft.r=4",
            "--steps=2",
            f"--output_dir={root / 'peft'}",
        ],
        timeout_s=180,
    )
    assert res.returncode == 0, res.describe()
    return root


def _edit_json(file: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data, indent=2))


def _crafted(made: Path, tmp_path: Path, source: str, edit: Callable[[Path, Path], None]) -> Path:
    """A copy of ``made/source``'s pretrained_model edited by ``edit(directory, made)``."""
    directory = shutil.copytree(made / source, tmp_path / "sent", symlinks=True) / STEP
    edit(directory, made)
    return directory


def _train_on(launch, directory: Path, tmp_path: Path, *extra: str):
    before = launch.tree_digest(directory)
    res = launch.run_command(
        [TRAIN, *DATA, f"--policy.path={directory}", "--steps=1", f"--output_dir={tmp_path / 'out'}", *extra],
        timeout_s=180,
    )
    return res, before


def _refused(launch, res, before, directory: Path, tmp_path: Path, *needles: str) -> None:
    assert not res.timed_out and res.returncode == 2, res.describe()
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("lerobot-train: error:")]
    assert len(lines) == 1, res.describe()
    assert "Traceback" not in res.output, res.describe()
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert launch.tree_digest(directory) == before, "a refused run changed the directory it was given"
    assert not (tmp_path / "out" / "checkpoints").exists(), "a refused run wrote a checkpoint"


def _state_file_outside(directory: Path, made: Path) -> None:
    outside = made / "base" / STEP / "policy_preprocessor_step_3_normalizer_processor.safetensors"

    def change(data: dict) -> None:
        data["steps"][3]["state_file"] = str(outside)

    _edit_json(directory / "policy_preprocessor.json", change)


def _adapter(key: str, value) -> Callable[[Path, Path], None]:
    return lambda directory, made: _edit_json(
        directory / "adapter_config.json", lambda data: data.__setitem__(key, value)
    )


def _adapter_weights_as_int64(directory: Path, made: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    file = directory / "adapter_model.safetensors"
    tensors = load_file(file)
    first = min(tensors)
    tensors[first] = tensors[first].to(torch.int64)
    save_file(tensors, str(file), metadata={"format": "pt"})


def _config(change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    return lambda directory, made: _edit_json(directory / "config.json", change)


def _as_act(data: dict) -> None:
    """The MLP's config.json claiming to be an ACT policy (the MLP's own fields dropped)."""
    for key in (
        "hidden_dim",
        "n_blocks",
        "dropout",
        "optimizer_lr",
        "optimizer_weight_decay",
        "grad_clip_norm",
    ):
        data.pop(key)
    data["type"] = "act"


def _weights(change: Callable[[str, object], object]) -> Callable[[Path, Path], None]:
    def edit(directory: Path, made: Path) -> None:
        from safetensors.torch import load_file, save_file

        file = directory / "model.safetensors"
        tensors = load_file(file)
        save_file({k: change(k, v) for k, v in tensors.items()}, str(file), metadata={"format": "pt"})

    return edit


def _int64_action_head(name: str, tensor):
    import torch

    return tensor.to(torch.int64) if name == "action_head.weight" else tensor


def _fp16(name: str, tensor):
    import torch

    return tensor.to(torch.float16)


CASES: dict[str, tuple[str, Callable[[Path, Path], None], tuple[str, ...]]] = {
    # name: (source run, edit, what the one line must say)
    "state_file absolute": (
        "base",
        _state_file_outside,
        ("policy_preprocessor.json: steps[3].state_file = ", "is an absolute path"),
    ),
    "adapter r=0": ("peft", _adapter("r", 0), ("adapter_config.json: r = 0 must be an integer ≥ 1",)),
    "adapter targets everything": (
        "peft",
        _adapter("target_modules", ".*"),
        ('adapter_config.json: target_modules = ".*" matches every module name',),
    ),
    "adapter LoHa": (
        "peft",
        _adapter("peft_type", "LOHA"),
        ('adapter_config.json: peft_type = "LOHA" is not LORA',),
    ),
    "adapter dropout 1.5": (
        "peft",
        _adapter("lora_dropout", 1.5),
        ("adapter_config.json: lora_dropout = 1.5 must be a number in [0, 1)",),
    ),
    "adapter weights stored as int64": (
        "peft",
        _adapter_weights_as_int64,
        ("adapter_model.safetensors: tensor ", " is stored as I64, not a float type"),
    ),
    "config.json type of another policy": (
        "base",
        _config(_as_act),
        ("model.safetensors does not match the model (ACTPolicy): ", "type=act from ", "config.json"),
    ),
    "config.json sizes of terabytes": (
        "base",
        _config(lambda data: data.__setitem__("hidden_dim", 10**7)),
        ("config.json: this config builds a mlp policy of 745,058.6 GiB", "hidden_dim=10000000"),
    ),
    "weights stored as int64": (
        "base",
        _weights(_int64_action_head),
        ("model.safetensors: tensor action_head.weight is stored as int64 where the policy holds float32",),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_crafted_policy_path_is_refused_in_one_line(made, launch, tmp_path, name):
    source, edit, needles = CASES[name]
    directory = _crafted(made, tmp_path, source, edit)
    res, before = _train_on(launch, directory, tmp_path)
    _refused(launch, res, before, directory, tmp_path, *needles)


def test_a_policy_of_terabytes_is_refused_by_a_dry_run_too(made, launch, tmp_path):
    directory = _crafted(made, tmp_path, "base", _config(lambda data: data.__setitem__("hidden_dim", 10**7)))
    res, before = _train_on(launch, directory, tmp_path, "--dry_run=true")
    _refused(launch, res, before, directory, tmp_path, "config.json: this config builds a mlp policy of")


def test_fp16_weights_are_upcast_with_one_warning(made, launch, tmp_path):
    directory = _crafted(made, tmp_path, "base", _weights(_fp16))
    res, _ = _train_on(launch, directory, tmp_path)
    assert res.returncode == 0, res.describe()
    warned = [ln for ln in res.stderr.splitlines() if "stored in another float type" in ln]
    assert len(warned) == 1 and warned[0].startswith("lerobot-train: warning: "), res.describe()
    assert "model.safetensors: " in warned[0] and "(float16 to float32)" in warned[0], warned
