"""Sharded-checkpoint scenarios; ``argv = [out_dir, mode]``, each rank reports ``<mode>_rank<r>.json``.

* ``save``   (torchrun ×2, FSDP2 on a 1-D mesh): gather peak memory; train 3 steps and save in each
  ``checkpoint_format``; the same step saved asynchronously while step 4 trains (rank 1's
  background phase held back, so rank 0's waits in the checkpoint group during FSDP's
  collectives); same-topology resume (bitwise state, next loss equal to the uninterrupted
  run's); resumes from a garbled model / optimizer shard; a DCP write failing on rank 1 (also in
  the background of an asynchronous save) and a gathered write failing on rank 0; a fake PEFT adapter.
* ``single`` (one process, no process group; the test calls :func:`run` in its own process):
  resume every checkpoint, then save a non-sharded checkpoint.
* ``hsdp``   (torchrun ×4, 2-D mesh 2×2): resume everything, the adapter too; save a
  ``safetensors_dcp`` one (the gather on a 2-D mesh).
* ``ddp``    (torchrun ×2, DDP): resume everything; accelerate's ``merge_fsdp_weights`` on our shards
  (every rank calls it, as accelerate expects inside a launch).
"""

from __future__ import annotations

import sys
from pathlib import Path

from _common import arm_watchdog, write_json

if __name__ == "__main__":
    arm_watchdog(170)

import datetime
import errno
import gc
import os
import resource
import signal
import time

import torch
import torch.distributed as dist
from _ckpt_model import build, changed_params, diff, full_state, train_step
from lerobot_ckpt import (
    AsyncCheckpointer,
    CheckpointError,
    Parallelism,
    RunInfo,
    TrainingObjects,
    load_checkpoint,
    save_checkpoint,
)
from lerobot_ckpt.save import TEST_COMMIT_DELAY_ENV

OUT = Path(".")  # set by run()
FORMATS = ("safetensors", "dcp", "safetensors_dcp")


def adapter_state(sd):
    """A fake PEFT adapter: the fc1 layers, under PEFT-like names (what get_peft_model_state_dict returns)."""
    return {f"base_model.model.{k}": v for k, v in sd.items() if ".fc1." in k}


def write_pretrained(path: Path) -> None:
    (path / "config.json").write_text('{"type": "toy"}')
    (path / "train_config.json").write_text("{}")


def write_adapter_files(path: Path) -> None:
    write_pretrained(path)
    (path / "adapter_config.json").write_text('{"peft_type": "LORA", "base_model_name_or_path": "user/base"}')


def run_info(world: int, dp_replicate: int, dp_shard: int, fmt: str = "safetensors") -> RunInfo:
    return RunInfo(
        world_size=world, batch_size=4, parallelism=Parallelism(dp_replicate, dp_shard), checkpoint_format=fmt
    )


def last(name: str) -> Path:
    return OUT / name / "checkpoints" / "last"


def vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def rank0_save(obj, name: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(obj, OUT / name)


def resume_check(kind: str, mesh, source: str, ref: dict | None, dp_rank: int, **kw) -> dict:
    """Fresh model of ``kind``; load ``source``; compare with ``ref`` (rank 0); one more step."""
    model, opt, sched = build(kind, mesh)
    t0 = time.monotonic()
    state = load_checkpoint(
        last(source), objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched), **kw
    )
    res = {
        "load_s": round(time.monotonic() - t0, 3),
        "step": state.step,
        "rng_restored": state.rng_restored,
        "sampler": state.sampler_state,
    }
    loaded = full_state(model, opt)
    if ref is not None and loaded["model"]:
        res["diff"] = diff(ref["model"], loaded["model"], "model") + diff(
            ref["optimizer"], loaded["optimizer"], "optim"
        )
    res["lr"] = sched.get_last_lr()
    before = {k: v.clone() for k, v in loaded["model"].items()}
    res["next_loss"] = train_step(model, opt, sched, state.step + 1, dp_rank)
    after = full_state(model, opt)["model"]
    res["changed_after_step"] = changed_params(before, after) if before else None
    res["_after"] = after
    return res


def strip(res: dict) -> dict:
    return {k: v for k, v in res.items() if not k.startswith("_")}


# --------------------------------------------------------------------------------------------- save
def memory_scenario(mesh, rank: int) -> dict:
    """Rank 0's peak RSS during a gathered save of a 256 MiB model made of 16 MiB tensors."""
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        big = nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(16)])
    for layer in big:
        fully_shard(layer, mesh=mesh)
    fully_shard(big, mesh=mesh)
    big.to_empty(device="cpu")
    with torch.no_grad():
        for i, p in enumerate(big.parameters()):
            p.to_local().fill_(float(i + 1))
    gc.collect()
    rss = vm("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    t0 = time.monotonic()
    save_checkpoint(OUT / "mem", 1, run=run_info(2, 1, 2), objects=TrainingObjects(model=big))
    res = {
        "peak_increase": vm("VmHWM") - rss,
        "model_bytes": 16 * 2048 * 2048 * 4,
        "largest": 2048 * 2048 * 4,
        "save_s": round(time.monotonic() - t0, 2),
    }
    del big
    gc.collect()
    return res


def failure_drills(model, opt, sched, rank: int) -> dict:
    import torch.distributed.checkpoint as dcp

    res = {}
    real_write = dcp.FileSystemWriter.write_data

    def no_space(self, plan, planner):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    if rank == 1:
        dcp.FileSystemWriter.write_data = no_space
    try:
        save_checkpoint(
            OUT / "fmt_dcp",
            5,
            run=run_info(2, 1, 2, "dcp"),
            objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
            write_pretrained=write_pretrained,
        )
        res["rank1_dcp_failure"] = None
    except CheckpointError as exc:
        res["rank1_dcp_failure"] = [type(exc).__name__, str(exc)]
    finally:
        dcp.FileSystemWriter.write_data = real_write

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    if rank == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, limit[1]))
    try:
        save_checkpoint(
            OUT / "fmt_safetensors",
            5,
            run=run_info(2, 1, 2, "safetensors"),
            objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
            write_pretrained=write_pretrained,
        )
        res["rank0_gather_failure"] = None
    except CheckpointError as exc:
        res["rank0_gather_failure"] = [type(exc).__name__, str(exc)]
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    res["after_failures"] = {
        name: sorted(os.listdir(OUT / name / "checkpoints"))
        + [os.readlink(OUT / name / "checkpoints" / "last")]
        for name in ("fmt_dcp", "fmt_safetensors")
    }
    return res


def mode_save() -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
    res: dict = {"memory": memory_scenario(mesh, rank)}

    model, opt, sched = build("fsdp", mesh)
    res["losses"] = [train_step(model, opt, sched, step, rank) for step in (1, 2, 3)]
    rank0_save(full_state(model, opt), "ref_fsdp.pt")
    res["save_s"] = {}
    for fmt in FORMATS:
        t0 = time.monotonic()
        save_checkpoint(
            OUT / f"fmt_{fmt}",
            3,
            run=run_info(2, 1, 2, fmt),
            objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
            sampler_state={"epoch": 0, "offset": 24},
            write_pretrained=write_pretrained,
        )
        res["save_s"][fmt] = round(time.monotonic() - t0, 3)
    save_checkpoint(
        OUT / "peft",
        3,
        run=run_info(2, 1, 2, "safetensors_dcp"),
        objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
        write_pretrained=write_adapter_files,
        adapter_state=adapter_state,
    )
    saver = AsyncCheckpointer.create(timeout_s=60)
    if rank == 1:  # rank 0's background phase then waits for rank 1's in the checkpoint group, during step 4
        os.environ[TEST_COMMIT_DELAY_ENV] = "2.5"
    saver.save(
        OUT / "async_safetensors_dcp",
        3,
        run=run_info(2, 1, 2, "safetensors_dcp"),
        objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
        sampler_state={"epoch": 0, "offset": 24},
        write_pretrained=write_pretrained,
    )
    os.environ.pop(TEST_COMMIT_DELAY_ENV, None)
    in_flight = saver.in_flight
    res["uninterrupted_loss4"] = train_step(model, opt, sched, 4, rank)  # FSDP2 collectives meanwhile
    step4_done = time.monotonic()
    done = saver.wait()
    res["async"] = {
        "in_flight": in_flight,
        "snapshot_done": done.snapshot_done,
        "step4_done": step4_done,
        "committed": done.committed,
        "own_group": saver.group is not None
        and saver.group != dist.group.WORLD
        and dist.get_world_size(saver.group) == 2,
    }
    uninterrupted = full_state(model, opt)
    ref = torch.load(OUT / "ref_fsdp.pt") if rank == 0 else None

    res["same_topology"] = {}
    for fmt in FORMATS:
        r = resume_check("fsdp", mesh, f"fmt_{fmt}", ref, rank)
        if rank == 0:
            r["after_equals_uninterrupted"] = diff(uninterrupted["model"], r["_after"], "model")
        r["loss_equals_uninterrupted"] = r["next_loss"] == res["uninterrupted_loss4"]
        res["same_topology"][fmt] = strip(r)
    res["garbled"] = garbled_resumes(mesh, rank)
    res.update(failure_drills(model, opt, sched, rank))
    res["async_failure"] = async_failure(saver, model, opt, sched, rank)
    saver.close()
    return res


def async_failure(saver, model, opt, sched, rank: int) -> dict:
    """Rank 1's DCP write fails in the background (ENOSPC): the next wait raises the same error on
    both ranks, naming the rank and the step, and ``last`` stays on the asynchronous 000003."""
    import torch.distributed.checkpoint as dcp

    real_write = dcp.FileSystemWriter.write_data

    def no_space(self, plan, planner):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    if rank == 1:
        dcp.FileSystemWriter.write_data = no_space
    res: dict = {}
    try:
        saver.save(
            OUT / "async_safetensors_dcp",
            6,
            run=run_info(2, 1, 2, "safetensors_dcp"),
            objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
            write_pretrained=write_pretrained,
        )
        res["started"] = True
        train_step(model, opt, sched, 7, rank)
        saver.wait()
        res["error"] = None
    except CheckpointError as exc:
        res["error"] = [type(exc).__name__, str(exc)]
    finally:
        dcp.FileSystemWriter.write_data = real_write
    ckpts = OUT / "async_safetensors_dcp" / "checkpoints"
    res["after"] = sorted(os.listdir(ckpts)) + [os.readlink(ckpts / "last")]
    return res


GARBLED = {
    "model": "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp",
    "optimizer": "training_state/optimizer_0/__0_0.distcp",
}


def garbled_resumes(mesh, rank: int) -> dict:
    """Resume copies of the dcp checkpoint with one shard file overwritten by random bytes of the same size:
    every rank must raise the same CorruptCheckpointError naming that file, before changing anything."""
    import random
    import shutil

    if rank == 0:
        for what, relative in GARBLED.items():
            shutil.copytree(OUT / "fmt_dcp", OUT / f"garbled_{what}", symlinks=True)
            shard = last(f"garbled_{what}") / relative
            shard.write_bytes(random.Random(0).randbytes(shard.stat().st_size))
    dist.barrier()
    res = {}
    for what in GARBLED:
        model, opt, sched = build("fsdp", mesh)
        before = [p.to_local().clone() for p in model.parameters()]
        try:
            load_checkpoint(
                last(f"garbled_{what}"), objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched)
            )
            res[what] = None
        except CheckpointError as exc:
            res[what] = [type(exc).__name__, str(exc)]
        res[f"{what}_unchanged"] = (
            all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters(), strict=True))
            and not opt.state
        )
    return res


# -------------------------------------------------------------------------------------------- single
def mode_single() -> dict:
    assert not dist.is_initialized()
    ref = torch.load(OUT / "ref_fsdp.pt")
    res: dict = {"resumes": {}}
    for source in [f"fmt_{fmt}" for fmt in FORMATS] + ["converted"]:
        res["resumes"][source] = strip(resume_check("plain", None, source, ref, 0))
    model, opt, sched = build("plain")
    load_checkpoint(last("fmt_dcp"), objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched))
    train_step(model, opt, sched, 4, 0)
    save_checkpoint(
        OUT / "single",
        4,
        run=RunInfo(world_size=1, batch_size=4),
        objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
        write_pretrained=write_pretrained,
    )
    torch.save(full_state(model, opt), OUT / "ref_single.pt")
    return res


# ---------------------------------------------------------------------------------------- hsdp / ddp
def sources_and_refs(names: list[str], rank: int) -> dict:
    files = {"single": "ref_single.pt", "hsdp": "ref_hsdp.pt"}
    return {n: (torch.load(OUT / files.get(n, "ref_fsdp.pt")) if rank == 0 else None) for n in names}


def mode_hsdp() -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    names = [f"fmt_{fmt}" for fmt in FORMATS] + ["converted", "single"]
    res: dict = {
        "resumes": {
            n: strip(resume_check("hsdp", mesh, n, ref, rank))
            for n, ref in sources_and_refs(names, rank).items()
        }
    }

    model, opt, sched = build("hsdp", mesh)
    fresh = full_state(model, opt)["model"]
    load_checkpoint(
        last("peft"), objects=TrainingObjects(model=model), adapter_state=adapter_state, restore_rng=False
    )
    loaded = full_state(model, opt)["model"]
    if rank == 0:
        ref = torch.load(OUT / "ref_fsdp.pt")["model"]
        fc1 = [k for k in loaded if ".fc1." in k]
        res["adapter"] = {
            "keys": fc1,
            "diff": diff({k: ref[k] for k in fc1}, {k: loaded[k] for k in fc1}),
            "others_untouched": diff(
                {k: fresh[k] for k in fresh if k not in fc1}, {k: loaded[k] for k in loaded if k not in fc1}
            ),
        }

    model, opt, sched = build("hsdp", mesh)
    load_checkpoint(last("fmt_dcp"), objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched))
    train_step(model, opt, sched, 4, rank)
    save_checkpoint(
        OUT / "hsdp",
        4,
        run=run_info(4, 2, 2, "safetensors_dcp"),
        objects=TrainingObjects(model=model, optimizer=opt, scheduler=sched),
        write_pretrained=write_pretrained,
    )
    rank0_save(full_state(model, opt), "ref_hsdp.pt")
    return res


def mode_ddp() -> dict:
    from accelerate.utils import merge_fsdp_weights  # interop: accelerate's own merge reads our shards

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    names = [f"fmt_{fmt}" for fmt in FORMATS] + ["converted", "single", "hsdp"]
    res = {
        "resumes": {
            n: strip(resume_check("ddp", None, n, ref, rank))
            for n, ref in sources_and_refs(names, rank).items()
        }
    }
    merge_fsdp_weights(
        str(last("fmt_dcp") / "pretrained_model" / "pytorch_model_fsdp_0"), str(OUT / "accelerate_merged")
    )
    return res


def run(out: Path, mode: str) -> None:
    global OUT
    OUT = Path(out)
    result = {"save": mode_save, "single": mode_single, "hsdp": mode_hsdp, "ddp": mode_ddp}[mode]()
    rank = dist.get_rank() if dist.is_initialized() else 0
    write_json(OUT / f"{mode}_rank{rank}.json", result)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        time.sleep(0.5)  # gloo can SIGABRT at interpreter exit right after destroy (pytorch#190489)


if __name__ == "__main__":
    run(Path(sys.argv[1]), sys.argv[2])
