"""Sharded checkpoints end to end, on real gloo processes (scenarios in multiproc/ckpt_sharded.py).

One chain of launches, each checking many things: FSDP2 ×2 trains and saves in every
``checkpoint_format`` (plus failure drills, the gather's memory, a fake PEFT adapter) → the
converter and accelerate's merge run offline on the shards → the checkpoints are resumed on 1
process (no process group), on HSDP 2×2 and on DDP ×2, each compared bitwise with the saved state.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

FORMATS = ("safetensors", "dcp", "safetensors_dcp")
RESUMED = [f"fmt_{f}" for f in FORMATS] + ["converted"]


def _tensors(path: Path) -> dict:
    from lerobot_ckpt import read_tensors

    return read_tensors(path)[0]


def _bitwise_equal(a: dict, b: dict) -> list[str]:
    import torch

    if a.keys() != b.keys():
        return [f"keys {sorted(a.keys() ^ b.keys())}"]
    return [
        k
        for k in a
        if a[k].dtype != b[k].dtype
        or a[k].shape != b[k].shape
        or not torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8))
    ]


def _in_this_process(script: Path, out: Path, mode: str):
    import importlib.util
    import random
    import time

    import numpy as np
    import torch

    assert not torch.distributed.is_initialized()
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    sys.path.insert(0, str(script.parent))
    t0 = time.monotonic()
    try:
        spec = importlib.util.spec_from_file_location("lerobot_tests_ckpt_sharded", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.run(out, mode)
    finally:
        sys.path.remove(str(script.parent))
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])

    return SimpleNamespace(
        returncode=0, timed_out=False, elapsed_s=time.monotonic() - t0, describe=lambda: ""
    )


@pytest.fixture(scope="module")
def chain(tmp_path_factory, launch):
    out = tmp_path_factory.mktemp("sharded")
    script = launch.MULTIPROC / "ckpt_sharded.py"
    timings = {}

    def ok(result, what):
        timings[what] = round(result.elapsed_s, 1)
        assert result.returncode == 0 and not result.timed_out, f"{what}: {result.describe()}"

    ok(launch.torchrun(script, str(out), "save", nproc=2, timeout_s=170), "save (FSDP2 x2)")

    # offline, between the launches: convert a copy of the dcp checkpoint and delete its shards (the
    # console script itself runs in packages/lerobot-ckpt/tests/test_ckpt_convert_cli.py)
    from lerobot_ckpt import convert_dcp

    shutil.copytree(out / "fmt_dcp", out / "converted", symlinks=True)
    convert_dcp(out / "converted" / "checkpoints" / "last", delete_dcp=True)
    # one process without a process group: this one (torch is imported already); RNG states restored after
    ok(_in_this_process(script, out, "single"), "single process (in pytest)")
    ok(launch.torchrun(script, str(out), "hsdp", nproc=4, timeout_s=240), "HSDP 2x2")
    ok(launch.torchrun(script, str(out), "ddp", nproc=2, timeout_s=150), "DDP x2")
    print("\nlaunch timings (s):", timings)

    def report(mode, rank=0):
        return json.loads((out / f"{mode}_rank{rank}.json").read_text())

    return out, report


def _step(out: Path, name: str) -> Path:
    return (out / name / "checkpoints" / "last").resolve()


@pytest.mark.slow
def test_each_format_writes_its_artifacts_and_records_them(chain):
    out, _ = chain
    for fmt in FORMATS:
        step = _step(out, f"fmt_{fmt}")
        assert step.name == "000003"
        pm, ts = step / "pretrained_model", step / "training_state"
        assert (pm / "model.safetensors").is_file() == (fmt != "dcp"), fmt
        assert (pm / "pytorch_model_fsdp_0" / ".metadata").is_file() == (fmt != "safetensors"), fmt
        assert sorted(p.name for p in (ts / "optimizer_0").iterdir()) == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
        ]
        assert (
            not (ts / "optimizer_state.safetensors").exists()
            and not (ts / "optimizer_param_groups.json").exists()
        )
        record = json.loads((ts / "training_step.json").read_text())
        assert (
            record["checkpoint_format"] == fmt and record["world_size"] == 2 and record["dp_world_size"] == 2
        )
        assert record["parallelism"] == {"dp_replicate": 1, "dp_shard": 2}
        assert record["artifacts"] == {
            "model_safetensors": fmt != "dcp",
            "model_dcp": fmt != "safetensors",
            "optimizer_single_file": False,
            "optimizer_dcp": True,
            "peft_adapter": False,
            "ema_safetensors": False,
            "ema_dcp": False,
            "scheduler": True,
            "scaler": False,
        }
    hsdp = json.loads((_step(out, "hsdp") / "training_state" / "training_step.json").read_text())
    assert hsdp["parallelism"] == {"dp_replicate": 2, "dp_shard": 2} and hsdp["world_size"] == 4
    assert hsdp["checkpoint_format"] == "safetensors_dcp" and hsdp["artifacts"]["model_safetensors"]
    assert sorted(p.name for p in (_step(out, "hsdp") / "training_state" / "optimizer_0").iterdir()) == [
        ".metadata",
        *(f"__{r}_0.distcp" for r in range(4)),
    ]


@pytest.mark.slow
def test_gathered_weights_are_tied_fp32_and_rank0_holds_one_tensor_at_a_time(chain):
    out, report = chain
    weights = _step(out, "fmt_safetensors") / "pretrained_model" / "model.safetensors"
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as f:
        meta = f.metadata()
        names = list(f.keys())
        assert (
            meta["head.weight"] == "emb.weight" and "head.weight" not in names
        )  # the tie, as save_model writes it
        assert {f.get_slice(k).get_dtype() for k in names} == {"F32"}
    mem = report("save", 0)["memory"]
    print(
        f"\ngathered save of a {mem['model_bytes'] / 2**20:.0f} MiB model (largest tensor "
        f"{mem['largest'] / 2**20:.0f} MiB): rank-0 peak RSS +{mem['peak_increase'] / 2**20:.1f} MiB, "
        f"rank 1 +{report('save', 1)['memory']['peak_increase'] / 2**20:.1f} MiB, {mem['save_s']} s"
    )
    assert mem["peak_increase"] < 1.5 * mem["largest"] + 8 * 2**20
    import torch

    hsdp = torch.load(out / "ref_hsdp.pt")[
        "model"
    ]  # gathered on a 2-D mesh (p2p within rank 0's shard group)
    assert _bitwise_equal(hsdp, _tensors(_step(out, "hsdp") / "pretrained_model" / "model.safetensors")) == []
    assert report("save", 1)["memory"]["peak_increase"] < 0.5 * mem["largest"]
    written = _tensors(out / "mem" / "checkpoints" / "000001" / "pretrained_model" / "model.safetensors")
    assert len(written) == 16 and all(
        float(t[0, 0]) == i + 1 for i, t in enumerate(written[f"{n}.weight"] for n in range(16))
    )


@pytest.mark.slow
def test_same_topology_resume_is_bitwise_and_continues_like_the_uninterrupted_run(chain):
    _, report = chain
    for rank in (0, 1):
        for fmt, r in report("save", rank)["same_topology"].items():
            assert r["step"] == 3 and r["sampler"] == {"epoch": 0, "offset": 24} and r["rng_restored"], fmt
            assert r["loss_equals_uninterrupted"], fmt
            if rank == 0:
                assert r["diff"] == [] and r["after_equals_uninterrupted"] == [], fmt


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "ranks"), [("single", 1), ("hsdp", 4), ("ddp", 2)])
def test_resume_onto_another_topology_is_bitwise_and_training_continues(chain, mode, ranks):
    _, report = chain
    expected = RESUMED + {"single": [], "hsdp": ["single"], "ddp": ["single", "hsdp"]}[mode]
    for rank in range(ranks):
        resumes = report(mode, rank)["resumes"]
        assert sorted(resumes) == sorted(expected)
        for source, r in resumes.items():
            assert r["step"] == {"single": 4, "hsdp": 4}.get(source, 3), (mode, source)
            assert math.isfinite(r["next_loss"]), (mode, source)
            if rank == 0:
                assert r["diff"] == [], (mode, source, r["diff"][:5])
                assert r["changed_after_step"] == 14, (
                    mode,
                    source,
                )  # every parameter (the tie counts twice), not the buffer
            saved_ranks = {"single": 1, "hsdp": 4}.get(source, 2)
            assert r["rng_restored"] == (rank < saved_ranks), (mode, source, rank)


@pytest.mark.slow
def test_converter_output_equals_the_gathered_file_and_keeps_the_checkpoint_resumable(chain):
    out, _ = chain
    gathered = _tensors(_step(out, "fmt_safetensors") / "pretrained_model" / "model.safetensors")
    converted_step = _step(out, "converted")
    converted = _tensors(converted_step / "pretrained_model" / "model.safetensors")
    assert _bitwise_equal(gathered, converted) == []
    assert not (converted_step / "pretrained_model" / "pytorch_model_fsdp_0").exists()
    assert (converted_step / "training_state" / "optimizer_0" / ".metadata").is_file()  # still resumable
    record = json.loads((converted_step / "training_state" / "training_step.json").read_text())
    assert record["artifacts"]["model_safetensors"] and not record["artifacts"]["model_dcp"]
    assert record["artifacts"]["optimizer_dcp"] and record["checkpoint_format"] == "dcp"
    assert sorted(p.name for p in (converted_step / "pretrained_model").iterdir()) == [
        "config.json",
        "model.safetensors",
        "train_config.json",
    ]


@pytest.mark.slow
def test_accelerate_merge_fsdp_weights_reads_our_shards(chain):
    out, _ = chain
    merged = _tensors(out / "accelerate_merged" / "model.safetensors")
    gathered = _tensors(_step(out, "fmt_safetensors") / "pretrained_model" / "model.safetensors")
    assert _bitwise_equal(gathered, merged) == []


@pytest.mark.slow
def test_a_garbled_shard_is_the_same_corrupt_checkpoint_error_on_every_rank_before_any_change(chain):
    out, report = chain
    r0, r1 = report("save", 0)["garbled"], report("save", 1)["garbled"]
    for what, relative in (
        ("model", "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp"),
        ("optimizer", "training_state/optimizer_0/__0_0.distcp"),
    ):
        assert r0[what] == r1[what], what
        kind, message = r0[what]
        assert kind == "CorruptCheckpointError" and "\n" not in message, message
        named = message.removeprefix("checkpoint file is unreadable or corrupt: ").split(": ")[0]
        assert Path(named).resolve() == _step(out, f"garbled_{what}") / relative, message
        assert f": the record of {what}." in message, message
        assert (
            "is not a torch.save record" in message and "restore the directory from an intact copy" in message
        )
        assert r0[f"{what}_unchanged"] and r1[f"{what}_unchanged"], what


@pytest.mark.slow
def test_a_write_failing_on_one_rank_raises_the_same_error_on_every_rank(chain):
    _, report = chain
    r0, r1 = report("save", 0), report("save", 1)
    assert r0["rank1_dcp_failure"] == r1["rank1_dcp_failure"]
    kind, message = r0["rank1_dcp_failure"]
    assert kind == "CheckpointWriteError"
    assert message.startswith(
        "rank 1: checkpoint 000005 was not saved (the previous checkpoint and `last` are "
        "unchanged): could not write "
    )
    assert "pytorch_model_fsdp_0: OSError: [Errno 28] No space left on device" in message
    assert r0["rank0_gather_failure"] == r1["rank0_gather_failure"]
    kind, message = r0["rank0_gather_failure"]
    assert kind == "CheckpointWriteError" and message.startswith("rank 0: checkpoint 000005 was not saved")
    assert "model.safetensors: OSError: [Errno 27] File too large" in message
    for r in (r0, r1):  # no staging leftovers, `last` untouched, seen by both ranks once the save raised
        assert r["after_failures"] == {
            "fmt_dcp": ["000003", "last", "000003"],
            "fmt_safetensors": ["000003", "last", "000003"],
        }


@pytest.mark.slow
def test_peft_adapter_shards_gather_convert_and_reshard(chain, tmp_path):
    out, report = chain
    step = _step(out, "peft")
    record = json.loads((step / "training_state" / "training_step.json").read_text())
    assert record["artifacts"]["peft_adapter"] and record["artifacts"]["model_dcp"]
    assert not record["artifacts"]["model_safetensors"]
    gathered = _tensors(step / "pretrained_model" / "adapter_model.safetensors")
    assert sorted(gathered) == sorted(
        f"base_model.model.blocks.{i}.fc1.{p}" for i in (0, 1) for p in ("bias", "weight")
    )
    copy = tmp_path / "peft_step"
    shutil.copytree(step, copy)
    from lerobot_ckpt import convert_dcp

    result = convert_dcp(copy, overwrite=True)
    assert result.output == copy / "pretrained_model" / "adapter_model.safetensors"
    assert _bitwise_equal(gathered, _tensors(result.output)) == []
    adapter = report("hsdp", 0)["adapter"]
    assert len(adapter["keys"]) == 4 and adapter["diff"] == [] and adapter["others_untouched"] == []


def _dcp_tensors(directory: Path, tmp: Path) -> dict:
    """Every tensor of a DCP directory, read offline (DCP's own single-process conversion)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = tmp / f"{directory.parent.parent.parent.name}_{directory.name}.pt"
    dcp_to_torch_save(directory, target)
    flat: dict = {}

    def walk(value, where):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}/{k}")
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, torch.Tensor):
            flat[where] = value
        else:
            flat[where] = torch.tensor([hash(repr(value))])  # param-group values: compared by repr

    walk(torch.load(target, weights_only=False), "")
    return flat


@pytest.mark.slow
def test_an_async_save_under_fsdp2_writes_the_sync_save_s_tensors_while_training_goes_on(chain, tmp_path):
    """Step 3 saved synchronously and asynchronously (safetensors_dcp); step 4 trained while the
    asynchronous one was in flight (rank 1's background phase held back 2.5 s, so rank 0's waited
    in the checkpoint group during FSDP2's all-gathers and reduce-scatters on the training group)."""
    out, report = chain
    sync, asyn = (
        out / "fmt_safetensors_dcp" / "checkpoints" / "000003",
        out / "async_safetensors_dcp" / "checkpoints",
    )
    for r in (report("save", 0), report("save", 1)):
        a = r["async"]
        assert a["in_flight"] == 3 and a["own_group"], a
        assert a["snapshot_done"] < a["step4_done"] < a["committed"], (
            a
        )  # step 4 ran while the save was in flight
    for name in ("pretrained_model/pytorch_model_fsdp_0", "training_state/optimizer_0"):
        theirs, ours = _dcp_tensors(sync / name, tmp_path), _dcp_tensors(asyn / "000003" / name, tmp_path)
        assert theirs and _bitwise_equal(theirs, ours) == [], name
    for name in ("pretrained_model/model.safetensors", "training_state/rng_state.safetensors"):
        from lerobot_ckpt import read_tensors

        (a, meta_a), (b, meta_b) = read_tensors(sync / name), read_tensors(asyn / "000003" / name)
        assert meta_a == meta_b and _bitwise_equal(a, b) == [], name
    for name in (
        "training_state/scheduler_state.json",
        "training_state/training_step.json",
        "pretrained_model/config.json",
    ):
        assert (sync / name).read_bytes() == (asyn / "000003" / name).read_bytes(), name


@pytest.mark.slow
def test_a_background_write_failing_on_rank_1_is_raised_on_both_at_the_wait_and_last_stays(chain):
    _, report = chain
    r0, r1 = report("save", 0)["async_failure"], report("save", 1)["async_failure"]
    assert r0["started"] and r1["started"]  # the save itself returned: the failure happened in the background
    assert r0["error"] == r1["error"]
    kind, message = r0["error"]
    assert kind == "CheckpointWriteError" and "\n" not in message
    assert message.startswith(
        "rank 1: checkpoint 000006 was not saved (the previous checkpoint and `last` are "
        "unchanged): could not write "
    )
    assert "No space left on device" in message
    assert (
        r0["after"] == r1["after"] == ["000003", "last", "000003"]
    )  # no staging leftovers, `last` unchanged
