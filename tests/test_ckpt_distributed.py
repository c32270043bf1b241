"""Collective save on 2 real gloo processes: only rank 0 writes, the barrier holds rank 1 until the
commit, per-rank RNG round trip, and a failure on either rank raises the same error on both."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    sys.path.insert(0, str(HERE.parent))
    from ckpt_launch import torchrun

    out = tmp_path_factory.mktemp("ddp")
    proc = torchrun(HERE, str(out), nproc=2, timeout=150)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)], out


@pytest.mark.slow
def test_only_rank0_writes_and_rank1_waits_for_the_commit(results):
    (r0, r1), out = results
    assert r0["writes"] and r0["save_file_calls"] == 3  # model, optimizer, rng
    assert r1["writes"] == [] and r1["save_file_calls"] == 0
    assert r1["save_seconds"] >= 1.0  # rank 0's write took ≥ 1 s; rank 1 returned only after it
    assert r1["seen_after_save"] == {"last": "000002", "record_step": 2, "config": True}
    step = out / "run" / "checkpoints" / "000002"
    assert json.loads((step / "training_state" / "training_step.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_ddp_round_trip_is_bitwise_and_rng_is_per_rank(results):
    (r0, r1), _ = results
    for r in (r0, r1):
        assert r["model_equal"] and r["optimizer_equal"] and r["rng_restored"]
        assert r["draws_after_load"] == r["draws_after_save"]
        assert not any(k.startswith("module.") for k in r["weight_keys"])
    assert r0["draws_after_save"] != r1["draws_after_save"]  # ranks were seeded apart


@pytest.mark.slow
def test_write_failure_on_rank0_raises_the_same_error_on_both(results):
    (r0, r1), _ = results
    assert r0["rank0_failure"] == r1["rank0_failure"]
    kind, message = r0["rank0_failure"]
    assert kind == "CheckpointWriteError"
    assert message.startswith(
        "rank 0: checkpoint 000003 was not saved (the previous checkpoint and `last` are "
        "unchanged): could not write "
    )
    assert "File too large" in message
    assert r0["after_failures"] == r1["after_failures"] == {"last": "000002", "entries": ["000002", "last"]}


@pytest.mark.slow
def test_failure_on_rank1_is_raised_on_rank0_too(results):
    (r0, r1), _ = results
    assert r0["rank1_failure"] == r1["rank1_failure"]
    kind, message = r1["rank1_failure"]
    assert kind == "CheckpointSaveError" and message.startswith("rank 1: checkpoint 000004 was not saved")
    assert "RuntimeError: injected" in message
    assert r0["save_file_calls_after_rank1_failure"] == r0["save_file_calls_before_rank1_failure"]


def _draws():
    import random

    import numpy as np
    import torch

    return [random.random(), float(np.random.rand()), torch.rand(3).tolist()]


def _worker(out: Path) -> None:
    """One scenario told top to bottom; each rank reports what it saw in rank<r>.json."""
    import datetime
    import os
    import random
    import resource
    import signal
    import time

    import lerobot_ckpt.safetensors.files as tensor_files
    import lerobot_ckpt.state.rng as rng_module
    import numpy as np
    import torch
    import torch.distributed as dist
    from lerobot_ckpt import (
        CheckpointError,
        RunInfo,
        TrainingObjects,
        load_checkpoint,
        resolve_last,
        save_checkpoint,
    )
    from safetensors import safe_open
    from torch import nn

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    run_dir = out / "run"
    ckpts = run_dir / "checkpoints"
    res: dict = {"writes": []}

    def audit(event, args):
        if event == "open" and isinstance(args[0], str | bytes | os.PathLike):
            mode, flags = args[1] or "", args[2] or 0
            writing = any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if writing and str(run_dir) in os.fsdecode(args[0]):
                res["writes"].append(os.fsdecode(args[0]))
        elif event in (
            "os.mkdir",
            "os.rename",
            "os.symlink",
            "os.remove",
            "os.rmdir",
            "shutil.rmtree",
        ) and any(str(run_dir) in str(a) for a in args):
            res["writes"].append(f"{event} {args[0]}")

    sys.addaudithook(audit)
    calls = {"n": 0}
    real_save_file = tensor_files.save_file

    def counting_save_file(*a, **k):
        calls["n"] += 1
        return real_save_file(*a, **k)

    tensor_files.save_file = counting_save_file  # safetensors writes from Rust, invisible to the audit hook

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    random.seed(10 + rank)
    np.random.seed(20 + rank)
    torch.manual_seed(30 + rank)
    for _ in range(2):
        model(torch.randn(4, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    def slow_pretrained(path):
        time.sleep(1.0)
        (path / "config.json").write_text("{}")
        (path / "train_config.json").write_text("{}")

    run = RunInfo(world_size=2, batch_size=4)
    saved_model = {k: v.clone() for k, v in net.state_dict().items()}
    saved_opt = opt.state_dict()
    t0 = time.monotonic()
    step_dir = save_checkpoint(
        run_dir,
        2,
        run=run,
        objects=TrainingObjects(model=model, optimizer=opt),
        sampler_state={"epoch": 0, "offset": 16},
        write_pretrained=slow_pretrained,
    )
    res["save_seconds"] = time.monotonic() - t0
    res["seen_after_save"] = {
        "last": resolve_last(ckpts).name,
        "record_step": json.loads((step_dir / "training_state" / "training_step.json").read_text())["step"],
        "config": (step_dir / "pretrained_model" / "config.json").is_file(),
    }
    res["save_file_calls"] = calls["n"]
    res["draws_after_save"] = _draws()

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    net2 = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt2 = torch.optim.AdamW(net2.parameters(), lr=1e-2)
    state = load_checkpoint(
        ckpts / "last" / "pretrained_model" / "train_config.json",
        objects=TrainingObjects(model=net2, optimizer=opt2),
    )
    res["draws_after_load"] = _draws()
    res["rng_restored"] = state.rng_restored
    res["model_equal"] = all(torch.equal(saved_model[k], v) for k, v in net2.state_dict().items())
    loaded_opt = opt2.state_dict()
    res["optimizer_equal"] = saved_opt["param_groups"] == loaded_opt["param_groups"] and all(
        torch.equal(saved_opt["state"][i][n], loaded_opt["state"][i][n])
        for i in saved_opt["state"]
        for n in saved_opt["state"][i]
    )
    with safe_open(step_dir / "pretrained_model" / "model.safetensors", "pt") as f:
        res["weight_keys"] = list(f.keys())

    # rank 0 hits a file-size limit (the kernel refuses the write, like a full disk)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    if rank == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, limit[1]))
    try:
        save_checkpoint(run_dir, 3, run=run, objects=TrainingObjects(model=model, optimizer=opt))
        res["rank0_failure"] = None
    except CheckpointError as exc:
        res["rank0_failure"] = [type(exc).__name__, str(exc)]
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)

    # rank 1 fails before rank 0 writes anything: rank 0 must not write and must raise too
    res["save_file_calls_before_rank1_failure"] = calls["n"]
    real_capture = rng_module.capture
    if rank == 1:

        def broken_capture():
            raise RuntimeError("injected")

        rng_module.capture = broken_capture
    try:
        save_checkpoint(run_dir, 4, run=run, objects=TrainingObjects(model=model, optimizer=opt))
        res["rank1_failure"] = None
    except CheckpointError as exc:
        res["rank1_failure"] = [type(exc).__name__, str(exc)]
    finally:
        rng_module.capture = real_capture
    res["save_file_calls_after_rank1_failure"] = calls["n"]
    res["after_failures"] = {"last": resolve_last(ckpts).name, "entries": sorted(os.listdir(ckpts))}

    (out / f"rank{rank}.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.5)  # gloo can SIGABRT at interpreter exit right after destroy (pytorch#190489)


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
