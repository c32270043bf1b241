"""What CPU CI cannot check, on one CUDA machine, in one prepared run: one report line per check.

    uv run python tools/gpu/check.py [--budget-s 420] [--only NAME ...] [--keep]
    uv run python tools/gpu/check.py --cpu-smoke      # the same code paths on CPU, tiny sizes (< 3 min)

Checks (each in a subprocess of its own with its own timeout, so one failure or hang hides nothing; a
global budget, ``--budget-s``, turns what is left into SKIP lines; see tools/gpu/README.md for what each
one proves and what one GPU cannot show):

* ``nccl-1rank``: ``torchrun --nproc-per-node=1`` of a worker that asks lerobot_parallel for the device
  and backend of a cuda rank (``resolve_device``, ``backend_for``), creates that process group (world
  size 1: lerobot_parallel itself creates none for one process) and the runtime's device mesh
  (``ParallelRuntime.build_mesh``), then all_reduce / all_gather_into_tensor / reduce_scatter_tensor
  on CUDA tensors over the mesh's group.
* ``torchrun-train``: ``lerobot-train`` under ``torchrun --nproc-per-node=1`` on the demo dataset on cuda
  (launch line, device, finite loss). ``ddp-2gpu``, ``fsdp2-2gpu``, ``fsdp2-offload-2gpu``: the real
  2-rank NCCL runs, only with ≥ 2 GPUs (two ranks on one GPU are refused by NCCL).
* ``bf16``, ``fp16``: ``lerobot-train`` a few dozen steps under autocast (fp16 with the loss scaler,
  fused AdamW and async checkpoints where the flags exist): finite, decreasing loss, fp16's
  ``training_state/scaler_state.json``, ``gpu_mem_gb`` in metrics.jsonl.
* ``fsdp2-offload-1rank``: ``lerobot_parallel.sharding.apply_sharding`` of a dp_shard=2 plan with
  ``FSDPConfig(cpu_offload=True)`` on a one-rank mesh, driven by ``TrainLoop``: parameters are DTensors
  on the host, pinned; gradients land on the host; first-step gradients and update equal an unsharded
  copy's on the GPU.
* ``compile-ac-full``, ``compile-ac-selective``: ``build_plan`` + ``wrap_model`` with activation
  checkpointing and regional inductor compile on ACT: gradients vs eager within 1e-4 relative (fp32, TF32
  off), then training steps through ``TrainLoop``.
* ``memory-act``, ``memory-pi0``: ``torch.cuda.max_memory_allocated`` of one training step with
  checkpointing none / full / selective (ACT at LeRobot's default size and a mid-size pi0, batch 32).
* ``speed-act``, ``speed-pi0``: steps/s of ``lerobot-train`` vs a bare PyTorch loop on cuda
  (tools/bench/loop_overhead.py's comparison, with a device), target ratio ≥ 0.97.

The mid-size pi0 is ``bench_250m`` of tools/bench/pi0_memory.py (LeRobot's 18 joint layer pairs at
width 256, a 12-layer SigLIP; 253 M values, 121 M trainable), registered in this script's processes
only. Everything is written under a temporary directory, removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
TOKENIZER = REPO / "data" / "tokenizers" / "demo_bytes"
BIN = Path(sys.executable).parent
LEROBOT_TRAIN = str(BIN / "lerobot-train")
RESULT = "@@RESULT "
GIB = 1024**3

DATA = ["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}"]
# The tiny ACT of tests/guide_harness.py; chunk 20 like the README so the loss has something to learn.
TINY_ACT = [
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=20",
    "--policy.n_action_steps=20",
]
# LeRobot's default size (dim 512, 4+1 layers, 4 VAE layers, chunk 100); the machine has no network
DEFAULT_ACT = ["--policy.type=act", "--policy.pretrained_backbone_weights=null"]
TINY_PI0 = [
    "--policy.type=pi0",
    "--policy.paligemma_variant=gemma_tiny",
    "--policy.action_expert_variant=gemma_tiny",
    "--policy.vision_variant=tiny",
    "--policy.image_resolution=[56,56]",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
    f"--policy.tokenizer_name={TOKENIZER}",
]
MID_PI0 = [
    "--policy.type=pi0",
    "--policy.paligemma_variant=bench_250m",
    "--policy.action_expert_variant=bench_250m",
    "--policy.vision_variant=bench_250m",
    f"--policy.tokenizer_name={TOKENIZER}",
]


# ============================================================================================ helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def register_pi0_variants() -> None:
    """bench_250m (tools/bench/pi0_memory.py's definition) in lerobot_cli's variant tables,
    this process only."""
    sys.path.insert(0, str(REPO / "tools" / "bench"))
    from pi0_memory import _register_bench_variants

    _register_bench_variants()


_RUNNING: set[subprocess.Popen] = set()  # a check child's commands in flight (ended with it, see child())


def run_cmd(cmd: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """A command of a check (lerobot-train, torchrun) in a session of its own, ended whole on timeout."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd or REPO,
        start_new_session=True,
    )
    _RUNNING.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, _ = proc.communicate()
        raise CheckError(
            f"timed out after {timeout:.0f} s: {' '.join(cmd[:4])} ...; last output: {tail(out, 3)}"
        ) from None
    finally:
        _RUNNING.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def kill_tree(proc: subprocess.Popen, grace_s: float = 5) -> None:
    """SIGTERM to the process group ``proc`` leads (torchrun passes it to its ranks),
    SIGKILL after ``grace_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _end_running(signum, frame) -> None:
    """A check child told to stop (its timeout or the budget) ends its commands first: they run in
    sessions of their own, which the orchestrator's signal to the child's group does not reach."""
    for proc in list(_RUNNING):
        kill_tree(proc)
    os._exit(128 + signum)


def tail(text: str, n: int) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


class CheckError(Exception):
    """A check's verdict FAIL, with the sentence that says why."""


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise CheckError(message)


# ============================================================================= lerobot-train runs
class Ctx:
    """What a check child knows: device, smoke mode, the scratch directory, the flags --help lists."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.device = args.device  # "cuda" or "cpu"
        self.smoke = args.cpu_smoke
        self.tmp = Path(args.tmp)
        self.flags = set(filter(None, args.flags.split(",")))
        self.deadline = args.deadline  # this check's share of the budget ends here

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def out_dir(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.tmp)) / "run"


def train(
    ctx: Ctx,
    name: str,
    policy: list[str],
    extra: list[str],
    *,
    nproc: int = 0,
    timeout: float = 240,
    pi0_variants: bool = False,
) -> tuple[Path, str, list[dict]]:
    """Run lerobot-train (under torchrun when ``nproc``); returns (output dir, console, metrics records).

    ``pi0_variants``: run it through this script's ``--lerobot-train`` entry, which registers bench_250m
    first.
    """
    out = ctx.out_dir(name)
    args = [*DATA, *policy, "--num_workers=0", f"--policy.device={ctx.device}", f"--output_dir={out}", *extra]
    entry = (
        [sys.executable, str(Path(__file__).resolve()), "--lerobot-train"]
        if pi0_variants
        else [LEROBOT_TRAIN]
    )
    if nproc:
        script = entry[1:] if pi0_variants else entry
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            f"--master-port={free_port()}",
            *script,
            *args,
        ]
    else:
        cmd = [*entry, *args]
    proc = run_cmd(cmd, timeout)
    if proc.returncode != 0:
        raise CheckError(f"lerobot-train exited {proc.returncode}: {tail(proc.stdout, 4)}")
    metrics = out / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    return out, proc.stdout, records


def banner(console: str, prefix: str) -> str:
    for line in console.splitlines():
        if line.startswith(prefix):
            return line
    raise CheckError(f"no '{prefix}' line in lerobot-train's output")


def losses_of(records: list[dict]) -> list[float]:
    losses = [r.get("loss") for r in records]
    expect(bool(losses), "metrics.jsonl has no records")
    expect(
        all(v is not None and math.isfinite(v) for v in losses), f"non-finite loss in metrics.jsonl: {losses}"
    )
    return losses


def mem_metric(ctx: Ctx, records: list[dict]) -> str:
    key = "gpu_mem_gb" if ctx.cuda else "peak_rss_gb"
    vals = [r[key] for r in records if r.get(key) is not None]
    if not vals:
        raise CheckError(f"metrics.jsonl has no {key}")
    return f"{key}={max(vals):.2f}"


# ============================================================================================ checks
def check_nccl_1rank(ctx: Ctx) -> str:
    """torchrun x1 of this script's --worker nccl (see worker_nccl)."""
    report = ctx.tmp / "nccl.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=1",
        f"--master-port={free_port()}",
        str(Path(__file__).resolve()),
        "--worker",
        "nccl",
        "--device",
        ctx.device,
        "--tmp",
        str(report),
    ]
    proc = run_cmd(cmd, 120)
    expect(
        proc.returncode == 0 and report.is_file(), f"worker exited {proc.returncode}: {tail(proc.stdout, 4)}"
    )
    r = json.loads(report.read_text())
    want = "nccl" if ctx.cuda else "gloo"
    expect(
        r["backend_for"] == want and r["backend"] == want,
        f"backend {r['backend']} (backend_for: {r['backend_for']}), expected {want}",
    )
    expect(r["ok"], f"collectives wrong: {r['detail']}")
    return (
        f"backend={r['backend']} device={r['device']} mesh={r['mesh']} {r['detail']}; world size 1 "
        f"(NCCL refuses two ranks on one GPU)"
    )


def worker_nccl(device: str, report: Path) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from lerobot_parallel import LaunchEnv, ParallelismConfig
    from lerobot_parallel.runtime import ParallelRuntime, backend_for, resolve_device

    launch = LaunchEnv.from_environ()
    dev = resolve_device(device, launch.local_rank, launch.local_world_size)
    backend = backend_for(dev)
    if dev.type == "cuda":
        torch.accelerator.set_device_index(dev.index)
    # lerobot_parallel creates no group for one process, so this is its call for a multi-rank launch
    # (init_process_group from the launcher's env, device_id for nccl) made at world size 1.
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=datetime.timedelta(seconds=60),
        device_id=dev if backend == "nccl" else None,
    )
    try:
        rt = ParallelRuntime(
            rank=launch.rank,
            world_size=launch.world_size,
            local_rank=launch.local_rank,
            device=dev,
            backend=dist.get_backend(),
            parallelism=ParallelismConfig().resolve(1),
            mesh=None,
        )
        mesh = rt.build_mesh()
        group = mesh.get_group()
        x = torch.arange(8, dtype=torch.float32, device=dev) + 1
        dist.all_reduce(x, group=group)
        ok = bool(torch.equal(x.cpu(), torch.arange(8, dtype=torch.float32) + 1))
        parts = [f"all_reduce={'ok' if ok else 'WRONG'}"]
        gathered = torch.empty(8, device=dev)
        dist.all_gather_into_tensor(gathered, x, group=group)
        good = bool(torch.equal(gathered.cpu(), x.cpu()))
        ok &= good
        parts.append(f"all_gather={'ok' if good else 'WRONG'}")
        if backend == "nccl":  # gloo has no reduce_scatter_tensor; FSDP2 uses it on GPUs
            rs = torch.empty(8, device=dev)
            dist.reduce_scatter_tensor(rs, x, group=group)
            good = bool(torch.equal(rs.cpu(), x.cpu()))
            ok &= good
            parts.append(f"reduce_scatter={'ok' if good else 'WRONG'}")
        if dev.type == "cuda":
            torch.cuda.synchronize()
        report.write_text(
            json.dumps(
                {
                    "backend": dist.get_backend(),
                    "backend_for": backend,
                    "device": str(dev),
                    "mesh": f"{mesh.device_type}{tuple(mesh.shape)}",
                    "ok": ok,
                    "detail": " ".join(parts),
                }
            )
        )
    finally:
        dist.destroy_process_group()


def check_torchrun_train(ctx: Ctx) -> str:
    steps = 4 if ctx.smoke else 10
    _, console, records = train(
        ctx,
        "torchrun1",
        TINY_ACT,
        [f"--steps={steps}", "--batch_size=8", f"--log_freq={steps // 2}", "--save_checkpoint=false"],
        nproc=1,
    )
    launch, backend = banner(console, "Launch:"), banner(console, "Backend:")
    expect("torchrun, world size 1" in launch, launch)
    want = "device cuda:0" if ctx.cuda else "device cpu"
    expect(want in backend, f"{backend!r} lacks {want!r}")
    loss = losses_of(records)
    return (
        f"{backend.split(': ', 1)[1]}; {steps} steps, loss {loss[0]:.3f} -> {loss[-1]:.3f}, "
        f"{mem_metric(ctx, records)}"
    )


def two_rank_run(ctx: Ctx, name: str, extra: list[str], expect_lines: list[str]) -> str:
    """torchrun x2 of lerobot-train (the orchestrator skips it with fewer than 2 GPUs)."""
    steps = 4
    _, console, records = train(
        ctx,
        name,
        TINY_ACT,
        [f"--steps={steps}", "--batch_size=4", "--log_freq=2", f"--save_freq={steps}", *extra],
        nproc=2,
    )
    want = "nccl" if ctx.cuda else "gloo"
    backend = banner(console, "Backend:")
    expect(f"Backend: {want}" in backend, f"{backend!r}, expected backend {want}")
    for line in expect_lines:
        expect(line in console, f"no {line!r} in the output")
    loss = losses_of(records)
    return (
        f"{backend.split(': ', 1)[1]}; {steps} steps, loss {loss[0]:.3f} -> {loss[-1]:.3f}, "
        f"{mem_metric(ctx, records)}"
    )


def check_ddp_2gpu(ctx: Ctx) -> str:
    return two_rank_run(ctx, "ddp2", [], ["dp_replicate=2 x dp_shard=1 (DDP)"])


def check_fsdp2_2gpu(ctx: Ctx) -> str:
    return two_rank_run(
        ctx,
        "fsdp2",
        ["--parallelism.dp_shard=2", "--accelerator.mixed_precision=bf16"],
        ["dp_replicate=1 x dp_shard=2 (FSDP2)", "parameters all-gathered in bfloat16"],
    )


def check_fsdp2_offload_2gpu(ctx: Ctx) -> str:
    return two_rank_run(
        ctx,
        "offload2",
        ["--parallelism.dp_shard=2", "--accelerator.fsdp.cpu_offload=true"],
        ["dp_replicate=1 x dp_shard=2 (FSDP2)", "CPU offload: yes"],
    )


def precision_run(ctx: Ctx, mode: str) -> str:
    # smoke: fp16 autocast on a CPU is slow (minutes for a dozen steps at batch 8 on 2 cores)
    steps, log, bs = (4, 2, 2) if ctx.smoke else (40, 5, 8)
    extra = [
        f"--accelerator.mixed_precision={mode}",
        f"--steps={steps}",
        f"--batch_size={bs}",
        f"--log_freq={log}",
        f"--save_freq={steps // 2}",
        "--optimizer.lr=1e-3",
    ]
    notes = []
    if "--optimizer.fused" in ctx.flags and ctx.cuda:
        extra.append("--optimizer.fused=true")
        notes.append("fused AdamW")
    if "--checkpoint_async" in ctx.flags:
        extra.append("--checkpoint_async=true")
        notes.append("async saves")
    out, console, records = train(ctx, mode, TINY_ACT, extra)
    line = banner(console, "Precision:")
    expect(line.startswith(f"Precision: {mode}"), line)
    loss = losses_of(records)
    half = max(1, len(loss) // 2)
    first, last = statistics.mean(loss[:half]), statistics.mean(loss[half:])
    # The smoke's few fp16 steps may all be skipped by the scaler (its first scale, 65536, overflows)
    if not ctx.smoke:
        expect(last < first, f"loss did not decrease: {loss}")
    last_ckpt = out / "checkpoints" / "last"
    expect((last_ckpt / "pretrained_model" / "model.safetensors").is_file(), f"no checkpoint at {last_ckpt}")
    scaler = last_ckpt / "training_state" / "scaler_state.json"
    if mode == "fp16":
        expect(scaler.is_file(), f"no {scaler.relative_to(out)}")
        scale = json.loads(scaler.read_text()).get("scale")
        notes.append(f"scaler_state.json scale={scale}")
    else:
        expect(not scaler.is_file(), f"bf16 wrote {scaler.name}")
    return (
        f"{steps} steps, loss {loss[0]:.3f} -> {loss[-1]:.3f} (mean first/second half "
        f"{first:.3f}/{last:.3f}), {mem_metric(ctx, records)}; {', '.join(notes)}"
    )


def check_bf16(ctx: Ctx) -> str:
    return precision_run(ctx, "bf16")


def check_fp16(ctx: Ctx) -> str:
    return precision_run(ctx, "fp16")


# ------------------------------------------------------------------------------- in-process models
def act_model(default_size: bool, **overrides):
    """ACT with the demo's features (state 2, a 64x64 top camera, action 2), no backbone download."""
    from lerobot_cli.features import PolicyFeature
    from lerobot_cli.policies.act.config import ACTConfig
    from lerobot_cli.policies.act.modeling import ACTPolicy

    size = (
        {}
        if default_size
        else {
            "dim_model": 32,
            "dim_feedforward": 64,
            "n_heads": 2,
            "n_encoder_layers": 1,
            "n_decoder_layers": 1,
            "n_vae_encoder_layers": 1,
            "chunk_size": 10,
            "n_action_steps": 10,
        }
    )
    cfg = ACTConfig(
        input_features={
            "observation.state": PolicyFeature("STATE", (2,)),
            "observation.images.top": PolicyFeature("VISUAL", (3, 64, 64)),
        },
        output_features={"action": PolicyFeature("ACTION", (2,))},
        pretrained_backbone_weights=None,
        **{**size, **overrides},
    )
    return (lambda: ACTPolicy(cfg)), cfg


def act_batch(cfg, batch_size: int, device, seed: int = 0) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    b = {
        "observation.state": torch.randn(batch_size, 2, generator=g),
        "observation.images.top": torch.rand(batch_size, 3, 64, 64, generator=g),
        "action": torch.randn(batch_size, cfg.chunk_size, 2, generator=g),
        "action_is_pad": torch.zeros(batch_size, cfg.chunk_size, dtype=torch.bool),
    }
    return {k: v.to(device) for k, v in b.items()}


def pi0_model(mid: bool):
    """The mid-size pi0 (bench_250m, 224x224, chunk 50) or, for the smoke, the tests' tiny one."""
    register_pi0_variants()
    sys.path.insert(0, str(REPO / "tools" / "bench"))
    from lerobot_cli.policies.pi0.modeling import PI0Policy
    from pi0_memory import _config

    cfg = _config("bench_250m", 224, 50) if mid else _tiny_pi0_config()
    return (lambda: PI0Policy(cfg)), cfg


def _tiny_pi0_config():
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies.pi0.config import PI0Config

    return PI0Config(
        paligemma_variant="gemma_tiny",
        action_expert_variant="gemma_tiny",
        vision_variant="tiny",
        image_resolution=(56, 56),
        chunk_size=4,
        n_action_steps=4,
        tokenizer_max_length=16,
        input_features={
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 56, 56)),
            "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (6,))},
    )


def pi0_batch(cfg, batch_size: int, device) -> dict:
    sys.path.insert(0, str(REPO / "tools" / "bench"))
    from pi0_memory import _batch

    return _batch(cfg, batch_size, 0, 0, device)


def wrapped_single(model, device, accelerator):
    """build_plan + wrap_model for one process on ``device``, as lerobot-train applies them."""
    from lerobot_parallel.plan import build_plan
    from lerobot_parallel.runtime import ParallelRuntime
    from lerobot_parallel.wrap import wrap_model

    rt = ParallelRuntime.single(device)
    plan = build_plan(
        model,
        rt,
        accelerator,
        default_wrap_modules=getattr(type(model), "_fsdp_wrap_modules", None),
        default_unit_groups=getattr(type(model), "_fsdp_unit_groups", None),
    )
    return wrap_model(model, rt, plan), plan


def rel(a, b) -> float:
    import torch

    den = float(torch.linalg.vector_norm(b.double()))
    return (
        float(torch.linalg.vector_norm((a - b).double())) / den if den else float(torch.linalg.vector_norm(a))
    )


def grad_diff(model, ref) -> tuple[float, float, str]:
    """(global relative difference of all gradients, worst per-tensor relative difference among tensors
    holding at least 1e-3 of the largest tensor norm, that tensor's name)."""
    import torch
    from torch.distributed.tensor import DTensor

    ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    grads = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            grads[n.replace("_orig_mod.", "")] = g.detach().to("cpu", torch.float64)
    expect(set(grads) == set(ref_grads), f"gradient names differ: {sorted(set(grads) ^ set(ref_grads))[:4]}")
    ref64 = {n: g.detach().to("cpu", torch.float64) for n, g in ref_grads.items()}
    total = math.sqrt(sum(float((grads[n] - ref64[n]).square().sum()) for n in ref64))
    norm = math.sqrt(sum(float(g.square().sum()) for g in ref64.values()))
    biggest = max(float(torch.linalg.vector_norm(g)) for g in ref64.values())
    worst, name = 0.0, ""
    for n, g in ref64.items():
        if float(torch.linalg.vector_norm(g)) >= 1e-3 * biggest and (r := rel(grads[n], g)) > worst:
            worst, name = r, n
    return total / norm, worst, name


def check_fsdp2_offload_1rank(ctx: Ctx) -> str:
    """fully_shard of a dp_shard=2 plan's units on a one-rank mesh with the plan's CPUOffloadPolicy."""
    import datetime

    import torch
    import torch.distributed as dist
    from lerobot_parallel import AcceleratorConfig, FSDPConfig, ParallelismConfig
    from lerobot_parallel.plan import build_plan
    from lerobot_parallel.runtime import ParallelRuntime, backend_for, resolve_device
    from lerobot_parallel.sharding import apply_sharding, offload_policy
    from lerobot_parallel.wrap import WrappedModel
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    dev = resolve_device(ctx.device, 0, 1)
    backend = backend_for(dev)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
        device_id=dev if backend == "nccl" else None,
    )
    try:
        make, cfg = act_model(default_size=not ctx.smoke, dropout=0.0)
        batch = act_batch(cfg, 4 if ctx.smoke else 8, dev)
        torch.manual_seed(0)
        ref = make().to(dev).train()
        torch.manual_seed(0)
        model = make().train()
        acc = AcceleratorConfig(fsdp=FSDPConfig(cpu_offload=True))
        # The plan a dp_shard=2 launch makes (units, offload, precision), applied on the one rank there is.
        plan = build_plan(model, ParallelRuntime.preview(ParallelismConfig(dp_shard=2)), acc)
        expect(
            plan.cpu_offload and plan.units, f"plan: cpu_offload={plan.cpu_offload} units={len(plan.units)}"
        )
        mesh = init_device_mesh(dev.type, (1,), mesh_dim_names=("dp_shard",))
        rt = ParallelRuntime(
            rank=0,
            world_size=1,
            local_rank=0,
            device=dev,
            backend=backend,
            parallelism=ParallelismConfig().resolve(1),
            mesh=mesh,
        )
        pin = offload_policy(True)
        before = torch.cuda.memory_allocated(dev) if ctx.cuda else 0
        sharded, ignored = apply_sharding(model, rt, plan)
        resident = (
            torch.cuda.memory_allocated(dev) - before if ctx.cuda else 0
        )  # what sharding left on the GPU
        params = list(sharded.parameters())
        expect(
            all(isinstance(p, DTensor) for p in params), "some parameters are not DTensors after fully_shard"
        )
        on_host = sum(p.to_local().device.type == "cpu" for p in params)
        expect(
            on_host == len(params), f"{len(params) - on_host}/{len(params)} parameters are not on the host"
        )
        pinned = "n/a (no CUDA: not pinned)"
        if ctx.cuda:
            n_pinned = sum(p.to_local().is_pinned() for p in params)
            expect(
                pin.pin_memory and n_pinned == len(params),
                f"{n_pinned}/{len(params)} parameters pinned (CPUOffloadPolicy.pin_memory={pin.pin_memory})",
            )
            pinned = f"{n_pinned}/{len(params)} pinned"
        # first step: gradients and update vs the unsharded copy on the device
        torch.manual_seed(1)
        loss_ref, _ = ref(batch)
        loss_ref.backward()
        torch.manual_seed(1)
        loss, _ = sharded(batch)
        loss.backward()
        grads = [p.grad for p in params if p.grad is not None]
        expect(
            grads and all(g.to_local().device.type == "cpu" for g in grads), "gradients are not on the host"
        )
        g_global, g_worst, g_name = grad_diff(sharded, ref)
        expect(
            g_global < 1e-5 and g_worst < 1e-4,
            f"gradients differ from the unsharded run: {g_global:.2e} (worst {g_worst:.2e} at {g_name})",
        )
        opt = torch.optim.AdamW(params, lr=1e-3)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        opt.step()
        ref_opt.step()
        ref_params = dict(ref.named_parameters())
        upd = max(
            rel(p.full_tensor().detach().cpu(), ref_params[n].detach().cpu())
            for n, p in sharded.named_parameters()
        )
        expect(
            upd < 1e-5, f"parameters after one AdamW step (host) differ from the device copy's by {upd:.2e}"
        )
        opt.zero_grad(set_to_none=True)
        # then the loop's own step (gradient sync switch, clipping over host DTensor gradients, update)
        wrapped = WrappedModel(model=sharded, plan=plan, runtime=rt, ignored=ignored)
        steps = 3 if ctx.smoke else 6
        losses, step_s = loop_steps(wrapped, [batch], steps, warmup=1, optimizer=opt)
        expect(losses[-1] < losses[0], f"losses did not decrease: {losses}")
        gpu = ""
        if ctx.cuda:
            pbytes = sum(p.numel() * p.element_size() for p in params)
            gpu = (
                f"; on the GPU after fully_shard {resident / 2**20:.1f} MiB (buffers) for "
                f"{pbytes / 2**20:.0f} MiB of host parameters"
            )
        return (
            f"fully_shard of the dp_shard=2 plan's {len(plan.units)} units + root on a 1-rank {dev.type} "
            f"mesh ({backend}), CPUOffloadPolicy(pin_memory={pin.pin_memory}): {on_host}/{len(params)} "
            f"params on host, {pinned}, host grads; step 1 vs unsharded on {dev.type}: grads {g_global:.1e}, "
            f"params {upd:.1e}; TrainLoop {len(losses)} steps loss {losses[0]:.3f} -> {losses[-1]:.3f} "
            f"({step_s * 1000:.0f} ms/step){gpu}"
        )
    finally:
        dist.destroy_process_group()


def loop_steps(
    wrapped, batches: list, steps: int, warmup: int = 2, **loop_kwargs
) -> tuple[list[float], float]:
    """``warmup`` + ``steps`` TrainLoop steps (AdamW, clipping at 10): (every loss,
    seconds per timed step)."""
    import torch
    from lerobot_trainloop.loop import TrainLoop

    model = wrapped.model
    opt = loop_kwargs.pop("optimizer", None) or torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4
    )
    loop = TrainLoop(wrapped, opt, grad_clip_norm=10.0, **loop_kwargs)
    losses: list[float] = []
    loop.add_hook(lambda ev: losses.append(float(ev.output.loss)), every=1)
    loop.run(batches, warmup)  # compile, allocator and kernel warm-up
    t0 = time.perf_counter()
    loop.run(batches, warmup + steps)
    if wrapped.runtime.device.type == "cuda":
        torch.cuda.synchronize()
    per_step = (time.perf_counter() - t0) / steps
    expect(all(math.isfinite(v) for v in losses), f"non-finite TrainLoop losses {losses}")
    return losses, per_step


def compile_ac(ctx: Ctx, mode: str) -> str:
    import torch
    import torch._dynamo
    from lerobot_parallel import AcceleratorConfig, ActivationCheckpointingConfig, CompileConfig
    from lerobot_parallel.precision import build_precision

    dev = torch.device("cuda:0" if ctx.cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 everywhere: the comparison is of fp32 gradients
    torch.backends.cudnn.allow_tf32 = False
    make, cfg = act_model(default_size=not ctx.smoke, dropout=0.0)
    bs = 4 if ctx.smoke else 8
    batch = act_batch(cfg, bs, dev)
    torch.manual_seed(0)
    ref = make().to(dev).train()
    torch.manual_seed(0)
    model = make().train()
    # The smoke compiles with aot_eager (dynamo + AOT autograd, the same regions code path) because inductor's
    # C++ build of the CPU kernels takes minutes on 2 cores; on the GPU it is inductor (triton), the default.
    backend = "aot_eager" if ctx.smoke else "inductor"
    acc = AcceleratorConfig(
        activation_checkpointing=ActivationCheckpointingConfig(mode),
        compile=CompileConfig(enabled=True, backend=backend),
    )
    wrapped, plan = wrapped_single(model, dev, acc)
    expect(
        plan.activation_checkpointing == mode and plan.compile.enabled and plan.blocks,
        f"plan: {plan.describe_regions()}",
    )
    expect(build_precision("no", dev).autocast_dtype is None, "autocast on")
    torch.manual_seed(1)
    loss_ref, _ = ref(batch)
    loss_ref.backward()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(1)
    t0 = time.perf_counter()
    loss, _ = wrapped.model(batch)
    loss.backward()
    if ctx.cuda:
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    expect(graphs > 0, "nothing was compiled (dynamo made no graph)")
    l_rel = abs(float(loss) - float(loss_ref)) / abs(float(loss_ref))
    g_global, g_worst, g_name = grad_diff(wrapped.model, ref)
    expect(l_rel < 1e-5, f"loss {float(loss):.6f} vs eager {float(loss_ref):.6f}")
    # all gradients as one vector within 1e-4 relative; each large-enough tensor within 1e-3 (a small tensor's
    # relative error is dominated by summation order: inductor's fused kernels, attention backward atomics)
    expect(
        g_global < 1e-4 and g_worst < 1e-3,
        f"gradients vs eager: {g_global:.2e} relative (worst tensor {g_worst:.2e}: {g_name})",
    )
    steps = 3 if ctx.smoke else 10
    ref.zero_grad(set_to_none=True)
    wrapped.model.zero_grad(set_to_none=True)
    _, eager_s = loop_steps(wrapped_single(ref, dev, AcceleratorConfig())[0], [batch], steps)
    trained, compiled_s = loop_steps(wrapped, [batch], steps)
    expect(trained[-1] < trained[0], f"compiled losses did not decrease: {trained}")
    times = {"eager": eager_s, "compiled": compiled_s}
    return (
        f"ACT {'tiny' if ctx.smoke else 'default size'} batch {bs} on {dev.type}, {len(plan.blocks)} blocks, "
        f"{backend} {graphs} graphs: loss rel {l_rel:.1e}, grads rel {g_global:.1e} (worst tensor "
        f"{g_worst:.1e}), first step {first_s:.1f} s; {len(trained)} TrainLoop steps loss {trained[0]:.3f} "
        f"-> {trained[-1]:.3f}, {times['compiled'] * 1000:.1f} ms/step vs eager {times['eager'] * 1000:.1f}"
    )


def check_compile_ac_full(ctx: Ctx) -> str:
    return compile_ac(ctx, "full")


def check_compile_ac_selective(ctx: Ctx) -> str:
    return compile_ac(ctx, "selective")


def step_memory(make, batch: dict, dev, accelerator) -> tuple[int, int]:
    """(peak, peak above what was allocated before the step) of the second training step of a fresh
    model wrapped with ``accelerator``: CUDA's allocator peak, or on CPU the bytes saved for backward."""
    import torch

    torch.manual_seed(0)
    model = make().train()
    wrapped, _ = wrapped_single(model, dev, accelerator)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    def step() -> float:
        loss, _ = wrapped.model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    step()  # optimizer state, allocator and kernels warmed up
    if dev.type != "cuda":
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = step()
        expect(math.isfinite(loss), f"{accelerator.activation_checkpointing.mode}: loss {loss}")
        return saved[0], saved[0]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    loss = step()
    torch.cuda.synchronize()
    expect(math.isfinite(loss), f"{accelerator.activation_checkpointing.mode}: loss {loss}")
    peak = torch.cuda.max_memory_allocated(dev)
    return peak, peak - base


def memory(ctx: Ctx, which: str) -> str:
    """One step's peak CUDA memory per checkpointing mode (CPU: the bytes saved for backward instead)."""
    import gc

    import torch
    from lerobot_parallel import AcceleratorConfig, ActivationCheckpointingConfig

    dev = torch.device("cuda:0" if ctx.cuda else "cpu")
    bs = 4 if ctx.smoke else 32
    if which == "act":
        make, cfg = act_model(default_size=not ctx.smoke)
        batch = act_batch(cfg, bs, dev)
        label = f"ACT {'tiny' if ctx.smoke else 'default size'} batch {bs}"
    else:
        make, cfg = pi0_model(mid=not ctx.smoke)
        batch = pi0_batch(cfg, bs, dev)
        label = f"pi0 {'bench_250m 224px' if not ctx.smoke else 'tiny'} batch {bs}"
    rows = {}
    for mode in ("none", "full", "selective"):
        rows[mode] = step_memory(
            make, batch, dev, AcceleratorConfig(activation_checkpointing=ActivationCheckpointingConfig(mode))
        )
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()
    none = rows["none"]
    for mode in ("full", "selective"):
        expect(
            rows[mode][0] < none[0],
            f"{mode} peak {rows[mode][0] / GIB:.3f} GiB is not below none's {none[0] / GIB:.3f} GiB",
        )
    if ctx.cuda:
        parts = [f"{m} {p / GIB:.2f} GiB ({p / none[0]:.3f}x)" for m, (p, _) in rows.items()]
        extra = "; above the resident params+optimizer: " + ", ".join(
            f"{m} {d / GIB:.2f} GiB ({d / none[1]:.3f}x)" for m, (_, d) in rows.items()
        )
        return f"{label}, max_memory_allocated of one step: " + ", ".join(parts) + extra
    parts = [f"{m} {p / 2**20:.1f} MiB ({p / none[0]:.3f}x)" for m, (p, _) in rows.items()]
    return f"{label}, CPU (no CUDA allocator): bytes saved for backward " + ", ".join(parts)


def check_memory_act(ctx: Ctx) -> str:
    return memory(ctx, "act")


def check_memory_pi0(ctx: Ctx) -> str:
    return memory(ctx, "pi0")


# ------------------------------------------------------------------------------------------ speed
SPEED_EVERY = 10  # steps before the first timestamp, and the log interval of both sides (smoke: 5)


def speed(ctx: Ctx, which: str) -> str:
    """lerobot-train vs the bare loop, alternating rounds (tools/bench/loop_overhead.py's method)."""
    if which == "act":
        policy, steps = (
            [*(TINY_ACT if ctx.smoke else DEFAULT_ACT), "--policy.dropout=0.0"],
            (10 if ctx.smoke else 110),
        )
        label = f"ACT {'tiny' if ctx.smoke else 'default size'}"
    else:
        policy, steps = (TINY_PI0 if ctx.smoke else MID_PI0), (10 if ctx.smoke else 70)
        label = f"pi0 {'tiny' if ctx.smoke else 'bench_250m'}"
    bs, every, rounds = 8, (5 if ctx.smoke else SPEED_EVERY), (1 if ctx.smoke else 3)
    spec = {"policy": policy, "bs": bs, "steps": steps, "every": every, "pi0": which == "pi0"}
    b_times, o_times, started = [], [], time.time()
    for r in range(rounds):
        b_times.append(bare_rate(ctx, spec))
        o_times.append(ours_rate(ctx, spec))
        per_round = (time.time() - started) / (r + 1)
        if time.time() + per_round + 10 > ctx.deadline:
            break  # this check's share of the budget: fewer rounds rather than a SKIP
    b, o = statistics.median(b_times), statistics.median(o_times)
    ratio = b / o
    spread = ", ".join(f"{bt / ot:.3f}" for bt, ot in zip(b_times, o_times, strict=True))
    line = (
        f"{label} batch {bs} on {ctx.device}, fp32, {steps - every} timed steps: lerobot-train {1 / o:.2f} "
        f"steps/s, bare loop {1 / b:.2f} steps/s, ratio {ratio:.3f} (target >= 0.97; per round {spread})"
    )
    if ctx.smoke:
        return line + "; target not enforced in --cpu-smoke"
    expect(ratio >= 0.97, line)
    return line


def ours_rate(ctx: Ctx, spec: dict) -> float:
    """Seconds per loop step after warm-up, from the timestamps of lerobot-train's metric lines."""
    every = spec["every"]
    _, _, records = train(
        ctx,
        "speed",
        spec["policy"],
        [
            f"--steps={spec['steps']}",
            f"--batch_size={spec['bs']}",
            f"--log_freq={every}",
            "--save_checkpoint=false",
        ],
        pi0_variants=spec["pi0"],
        timeout=300,
    )
    times = [r["time_s"] for r in records]
    expect(len(times) >= 2, f"too few metric records ({len(times)})")
    return (times[-1] - times[0]) / (every * (len(times) - 1))


def bare_rate(ctx: Ctx, spec: dict) -> float:
    report = Path(tempfile.mkstemp(dir=ctx.tmp, suffix=".json")[1])
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "bare",
        "--device",
        ctx.device,
        "--tmp",
        str(report),
        f"--bare-spec={json.dumps(spec)}",
    ]
    proc = run_cmd(cmd, 300)
    expect(proc.returncode == 0, f"bare loop exited {proc.returncode}: {tail(proc.stdout, 4)}")
    return json.loads(report.read_text())["s_per_step"]


def worker_bare(device: str, report: Path, spec: dict) -> None:
    """The same work in a hand-written loop (DataLoader -> preprocess -> forward -> backward -> clip ->
    AdamW), reading the loss every ``every`` steps as lerobot-train's log steps do."""
    import torch
    from torch.utils.data import DataLoader

    if spec["pi0"]:
        register_pi0_variants()
    from lerobot_cli.cli.argv import split_argv
    from lerobot_cli.cli.build import build_train_config
    from lerobot_cli.seeding import set_seed
    from lerobot_cli.workload import build_workload

    cfg = build_train_config(
        split_argv([*DATA, *spec["policy"], f"--policy.device={device}"]).flags
    ).config.finalized()
    o = cfg.optimizer
    assert o.type == "adamw" and o.grad_clip_norm, o
    set_seed(cfg.seed)
    dev = torch.device("cuda:0" if device == "cuda" else "cpu")
    w = build_workload(cfg, device=str(dev))
    policy, pre = w.policy.to(dev).train(), w.preprocessor
    opt = torch.optim.AdamW(
        policy.get_optim_params(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
    )
    loader = DataLoader(
        w.dataset,
        batch_size=spec["bs"],
        shuffle=True,
        num_workers=0,
        drop_last=True,
        pin_memory=dev.type == "cuda",
    )
    params = [p for p in policy.parameters() if p.requires_grad]
    it, stamps = iter(loader), []
    for step in range(1, spec["steps"] + 1):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        loss, _ = policy(pre(batch))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o.grad_clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % spec["every"] == 0:
            float(loss.detach())  # the read a log step makes (it waits for the device)
            stamps.append(time.perf_counter())
    report.write_text(
        json.dumps({"s_per_step": (stamps[-1] - stamps[0]) / (spec["every"] * (len(stamps) - 1))})
    )


def check_speed_act(ctx: Ctx) -> str:
    return speed(ctx, "act")


def check_speed_pi0(ctx: Ctx) -> str:
    return speed(ctx, "pi0")


# ============================================================================== the orchestrator
# name, function, own timeout (s) on the GPU machine
CHECKS = [
    ("nccl-1rank", check_nccl_1rank, 60),
    ("torchrun-train", check_torchrun_train, 90),
    ("ddp-2gpu", check_ddp_2gpu, 90),
    ("fsdp2-2gpu", check_fsdp2_2gpu, 90),
    ("fsdp2-offload-2gpu", check_fsdp2_offload_2gpu, 90),
    ("bf16", check_bf16, 90),
    ("fp16", check_fp16, 90),
    ("fsdp2-offload-1rank", check_fsdp2_offload_1rank, 60),
    ("compile-ac-full", check_compile_ac_full, 150),
    ("compile-ac-selective", check_compile_ac_selective, 150),
    ("memory-act", check_memory_act, 60),
    ("memory-pi0", check_memory_pi0, 90),
    ("speed-act", check_speed_act, 200),
    ("speed-pi0", check_speed_pi0, 200),
]
TWO_RANK = {"ddp-2gpu", "fsdp2-2gpu", "fsdp2-offload-2gpu"}
MIN_START_S = 15  # a check is not started with less of the budget left


def child_env(smoke: bool, tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        and not k.startswith(("ACCELERATE_", "FSDP_"))
    }
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp / "hf_home"),
        HF_LEROBOT_HOME=str(tmp / "lerobot_home"),
        TRACKIO_DIR=str(tmp / "trackio"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    if smoke:  # CPU only, modest: one thread per process (others share this machine)
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def header(smoke: bool) -> tuple[int, list[str]]:
    import torch

    gpus = 0 if smoke else torch.cuda.device_count()
    lines = [
        f"python {platform.python_version()}, torch {torch.__version__}, CUDA (torch build) "
        f"{torch.version.cuda}, cuda available {torch.cuda.is_available()}, {gpus} GPU(s)"
        + (" [--cpu-smoke: CUDA hidden]" if smoke else "")
    ]
    for i in range(gpus):
        p = torch.cuda.get_device_properties(i)
        lines.append(f"GPU {i}: {p.name}, {p.total_memory / GIB:.1f} GiB, sm_{p.major}{p.minor}")
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            lines += [f"nvidia-smi: {ln}" for ln in smi.stdout.strip().splitlines()]
        except (OSError, subprocess.TimeoutExpired) as exc:
            lines.append(f"nvidia-smi: {exc}")
    else:
        lines.append("nvidia-smi: not found")
    git = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True, text=True, check=False
    )
    lines.append(f"repo {git.stdout.strip()[:100]}")
    return gpus, lines


def help_flags(env: dict[str, str]) -> set[str]:
    """The optional flags colleagues add, if this checkout's lerobot-train lists them."""
    try:
        out = subprocess.run(
            [LEROBOT_TRAIN, "--help"], capture_output=True, text=True, env=env, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {f for f in ("--optimizer.fused", "--checkpoint_async") if f in out}


def run_check(
    name: str,
    own_timeout: float,
    args: argparse.Namespace,
    env: dict[str, str],
    deadline: float,
    flags: set[str],
    gpus: int,
) -> tuple[str, str, float, str]:
    """(status, figures, seconds, output) of one check child."""
    if name in TWO_RANK and gpus < 2 and not (args.cpu_smoke and args.two_rank_on_cpu):
        why = (
            f"{gpus} GPU(s): two NCCL ranks need two GPUs (NCCL refuses two ranks on one GPU)"
            if not args.cpu_smoke
            else "--cpu-smoke: 2 gloo processes only with --two-rank-on-cpu"
        )
        return "SKIP", why, 0.0, ""
    left = deadline - time.time()
    if left < MIN_START_S:
        return "SKIP", f"global budget spent ({args.budget_s:.0f} s)", 0.0, ""
    own = own_timeout * (3 if args.cpu_smoke else 1)  # a loaded 2-core machine is several times slower
    limit = min(own, left)
    t0 = time.time()
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        name,
        "--device",
        args.device,
        "--tmp",
        str(args.tmp),
        f"--flags={','.join(sorted(flags))}",
        "--deadline",
        str(t0 + limit - 15),
        *(["--cpu-smoke"] if args.cpu_smoke else []),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        kill_tree(proc, grace_s=15)  # the child ends its own commands first (_end_running)
        out, _ = proc.communicate()
        spent = time.time() - t0
        if limit < own:
            return "SKIP", f"cut by the global budget after {spent:.0f} s", spent, out
        return "FAIL", f"timed out after {spent:.0f} s", spent, out
    spent = time.time() - t0
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT):
            r = json.loads(line[len(RESULT) :])
            return r["status"], r["figures"], spent, out
    return "FAIL", f"exited {proc.returncode} without a result: {tail(out, 2)[:300]}", spent, out


def child(args: argparse.Namespace) -> None:
    ctx = Ctx(args)
    fn = {n: f for n, f, _ in CHECKS}[args.child]  # (smoke: one thread per process via OMP_NUM_THREADS)
    signal.signal(signal.SIGTERM, _end_running)
    try:
        result = {"status": "PASS", "figures": fn(ctx)}
    except CheckError as exc:
        result = {"status": "FAIL", "figures": str(exc)}
    except Exception as exc:  # noqa: BLE001 - every error is this check's verdict, with its traceback above it
        traceback.print_exc()
        result = {
            "status": "FAIL",
            "figures": (
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
            ),
        }
    print(RESULT + json.dumps(result), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--budget-s", type=float, default=420.0, help="global time budget; checks not started by then SKIP"
    )
    p.add_argument("--cpu-smoke", action="store_true", help="the same code paths on CPU with tiny sizes")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help=f"run these checks only: {', '.join(n for n, _, _ in CHECKS)}",
    )
    p.add_argument(
        "--two-rank-on-cpu",
        action="store_true",
        help="with --cpu-smoke: run the 2-GPU checks' lerobot-train launches on 2 gloo CPU processes",
    )
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (outputs of every run)")
    p.add_argument("--tail", type=int, default=15, help="output lines shown for each failed check")
    # internal entries
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--device", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    p.add_argument("--flags", default="", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--bare-spec", default=None, help=argparse.SUPPRESS)
    if len(sys.argv) > 1 and sys.argv[1] == "--lerobot-train":  # lerobot-train with bench_250m registered
        register_pi0_variants()
        from lerobot_cli.train import main as lerobot_train

        return lerobot_train(sys.argv[2:])
    args = p.parse_args()
    if args.worker == "nccl":
        worker_nccl(args.device, Path(args.tmp))
        return 0
    if args.worker == "bare":
        worker_bare(args.device, Path(args.tmp), json.loads(args.bare_spec))
        return 0
    if args.child:
        child(args)
        return 0

    started = time.time()
    deadline = started + args.budget_s
    args.device = "cpu" if args.cpu_smoke else "cuda"
    gpus, lines = header(args.cpu_smoke)
    for line in lines:
        print(line, flush=True)
    if not args.cpu_smoke and gpus == 0:
        print("no CUDA device: run with --cpu-smoke on a machine without a GPU", flush=True)
        return 2
    names = [n for n, _, _ in CHECKS]
    unknown = set(args.only or ()) - set(names)
    if unknown:
        p.error(f"unknown check(s) {sorted(unknown)}; valid: {', '.join(names)}")
    tmp = Path(tempfile.mkdtemp(prefix="lerobot-gpu-check-"))
    args.tmp = tmp
    env = child_env(args.cpu_smoke, tmp)
    flags = help_flags(env)
    print(
        f"optional flags in --help: {', '.join(sorted(flags)) or 'none'}; scratch {tmp}; "
        f"budget {args.budget_s:.0f} s",
        flush=True,
    )
    results = []
    try:
        for name, _, own in CHECKS:
            if args.only and name not in args.only:
                continue
            status, figures, spent, out = run_check(name, own, args, env, deadline, flags, gpus)
            results.append((name, status, out))
            print(f"{name:<21} {status:<4} {figures} ({spent:.0f} s)", flush=True)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    failed = [(n, out) for n, s, out in results if s == "FAIL"]
    for name, out in failed:
        print(f"--- {name}: last {args.tail} lines of its output", flush=True)
        for line in [ln for ln in out.splitlines() if not ln.startswith(RESULT)][-args.tail :]:
            print(f"    {line}")
    counts = {s: sum(r[1] == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    print(
        f"{counts['PASS']} PASS, {counts['FAIL']} FAIL, "
        f"{counts['SKIP']} SKIP in {time.time() - started:.0f} s"
        + (" (--cpu-smoke: CPU code paths only, nothing about CUDA was checked)" if args.cpu_smoke else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
