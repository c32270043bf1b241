"""A checkpoint someone else wrote cannot run code on ``--resume=true`` or in ``lerobot-convert-dcp``.

One real FSDP2 ×2 run (DCP shards for the model, the optimizer and the EMA) is copied and edited the way
an attacker would: a record replaced by a pickle that runs ``touch <marker>``, or the model's
``relative_path`` entries pointed at another checkpoint's shards. Each copy is resumed on
one and on two processes and converted; every one must end with exit 2 and one line naming the file
and the entry, leave the checkpoint as it was, and never create the marker. The library-level cases
(each record kind, the load path without its pre-checks, param-group values) are in
packages/lerobot-ckpt/tests/test_ckpt_untrusted.py.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "lerobot-ckpt" / "tests"))
from crafted import (  # the library tests' crafting tools
    edit_metadata,
    exploit_metadata,
    exploit_record,
    replace_record,
    set_storage,
)

DEMO = REPO / "data" / "lerobot" / "demo_reach"
CONVERT = str(Path(sys.executable).parent / "lerobot-convert-dcp")
RUN = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=mlp",
    "--policy.hidden_dim=32",
    "--ema.enable=true",
    "--log_freq=1",
    "--batch_size=4",
]

pytestmark = pytest.mark.slow

OPTIMIZER, MODEL, EMA = (
    "training_state/optimizer_0",
    "pretrained_model/pytorch_model_fsdp_0",
    "pretrained_model_ema/pytorch_model_fsdp_0",
)


def _first_model_key(dcp_dir: Path) -> str:
    from lerobot_ckpt.dcp.index import DcpIndex

    return "model." + min(DcpIndex.read(dcp_dir).under("model"))


CRAFTS = {
    "optimizer byte item": lambda step, marker: (
        OPTIMIZER,
        "optimizer.param_groups.0.lr",
        replace_record(step / OPTIMIZER, "optimizer.param_groups.0.lr", exploit_record(marker)),
    ),
    "model shard": lambda step, marker: (
        MODEL,
        key := _first_model_key(step / MODEL),
        replace_record(step / MODEL, key, exploit_record(marker)),
    ),
    "EMA shard": lambda step, marker: (
        EMA,
        key := _first_model_key(step / EMA),
        replace_record(step / EMA, key, exploit_record(marker)),
    ),
    "model .metadata": lambda step, marker: (MODEL, "posix.system", exploit_metadata(step / MODEL, marker)),
    "model relative_path": lambda step, marker: (
        MODEL,
        "the relative_path of model.",
        _elsewhere(step / MODEL),
    ),
}


def _elsewhere(shards: Path) -> None:
    """The model's chunks named by absolute paths into the run's own, unedited checkpoint (another
    checkpoint on the same disk), with no shard file left here: a resume used to train from those
    weights, and the converter wrote them as this checkpoint's model.safetensors."""
    other = shards.parents[4] / "base" / "checkpoints" / "000002" / MODEL
    edit_metadata(shards, lambda m: set_storage(m, "relative_path", lambda p: str(other / p)))
    for shard in shards.glob("*.distcp"):
        shard.unlink()


@pytest.fixture(scope="module")
def base(tmp_path_factory, launch):
    root = tmp_path_factory.mktemp("crafted")
    launch.lerobot_train(
        *RUN,
        "--parallelism.dp_shard=2",
        "--checkpoint_format=dcp",
        "--steps=2",
        "--save_freq=2",
        f"--output_dir={root / 'base'}",
        nproc=2,
    )
    return root


def _crafted(base: Path, name: str) -> tuple[Path, Path, str, str]:
    """A copy of the base run with one crafted record: (its step dir, the marker, the dir, the entry)."""
    slug = name.replace(" ", "_").replace(".", "")
    run = shutil.copytree(base / "base", base / slug, symlinks=True)
    step, marker = run / "checkpoints" / "000002", base / f"{slug}.marker"
    where, entry, _ = CRAFTS[name](step, marker)
    return step, marker, where, entry


def _one_line_refusal(res, prefix: str, *needles: str, nproc: int = 1) -> None:
    """Exit 2 (under torchrun: the launcher's 1, its root cause 2), the error printed once, no traceback
    but torchrun's own ChildFailedError one (as in tests/test_bad_inputs.py)."""
    assert not res.timed_out, res.describe()
    if nproc == 1:
        assert res.returncode == 2, res.describe()
    else:
        root = re.search(r"Root Cause.*?exitcode\s*:\s*(-?\d+)", res.stderr, re.DOTALL)
        assert res.returncode != 0 and root and root.group(1) == "2", res.describe()
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1, res.describe()
    ours = res.output.split("Traceback (most recent call last):")[1:]
    assert all("torch/distributed/run.py" in tb and "ChildFailedError" in tb for tb in ours), res.describe()
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("name", list(CRAFTS))
def test_a_crafted_checkpoint_is_refused_on_resume_and_by_the_converter_and_runs_nothing(base, launch, name):
    step, marker, where, entry = _crafted(base, name)
    before = launch.tree_digest(step.parent.parent)
    runs = [("1 process", ["--parallelism.dp_shard=1", "--batch_size=8"], 1)]
    if name in ("optimizer byte item", "EMA shard"):
        runs.append(("2 processes", [], 2))
    for what, flags, nproc in runs:
        cmd = ["--resume=true", f"--config_path={step}", "--steps=4", *flags]
        res = (
            launch.run_command([launch.LEROBOT_TRAIN, *cmd], timeout_s=180)
            if nproc == 1
            else launch.torchrun(launch.LEROBOT_TRAIN, *cmd, nproc=2, timeout_s=240)
        )
        _one_line_refusal(res, "lerobot-train: error:", str(step / where), entry, nproc=nproc)
        assert not marker.exists(), f"{name}, {what}: the crafted pickle ran"
        assert launch.tree_digest(step.parent.parent) == before, f"{name}, {what}: the run directory changed"
    if where != OPTIMIZER:  # the converter reads the weights (and the EMA's)
        res = launch.run_command([CONVERT, f"--checkpoint_dir={step}"], timeout_s=60)
        _one_line_refusal(res, "lerobot-convert-dcp: error:", str(step / where), entry)
        assert not marker.exists(), f"{name}, converter: the crafted pickle ran"
        after = launch.tree_digest(step.parent.parent)
        assert after == before, (
            f"{name}: the converter wrote something",
            set(after.items()) ^ set(before.items()),
        )
