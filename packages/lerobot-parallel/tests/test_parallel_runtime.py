"""Runtime construction, device choice, wrapping and teardown in one process.

Multi-process behaviour (DDP, mesh, rank failure) is covered by tests/test_engine_multiproc.py
with real torchrun jobs; here a real single-member gloo group checks adoption and teardown.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from lerobot_parallel import (
    AcceleratorConfig,
    LaunchEnv,
    LaunchEnvError,
    ParallelismConfig,
    ParallelismError,
    effective_batch_line,
    effective_batch_size,
    samples_per_loop_step,
)
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime, backend_for, init_runtime, resolve_device
from lerobot_parallel.teardown import parallel_session, shutdown_process_group
from lerobot_parallel.wrap import WrappedModel, wrap_model

TORCHRUN_ENV = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "x",
}


def test_launch_env_from_torchrun():
    env = LaunchEnv.from_environ(TORCHRUN_ENV)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.master_addr, env.master_port, env.launcher) == ("10.0.0.1", 29500, "torchrun")
    assert env.is_multi_process


def test_launch_env_plain_accelerate_is_single_process():
    # `accelerate launch --num_processes=2` without GPUs: one process, MASTER_* but no ranks.
    env = LaunchEnv.from_environ(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "ACCELERATE_USE_CPU": "False"}
    )
    assert (env.rank, env.world_size, env.launcher) == (0, 1, "none")
    assert not env.is_multi_process


def test_launch_env_mpi_names():
    env = LaunchEnv.from_environ(
        {
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.launcher) == (
        2,
        4,
        0,
        2,
        "mpi",
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"RANK": "2", "WORLD_SIZE": "2"},
        {"WORLD_SIZE": "0"},
        {"WORLD_SIZE": "two"},
        {"WORLD_SIZE": "2", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "2"},
    ],
)
def test_launch_env_rejects_inconsistent_values(bad):
    with pytest.raises(ValueError):
        LaunchEnv.from_environ(bad)


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({"WORLD_SIZE": "2"}, "RANK/MASTER_ADDR/MASTER_PORT are not"),
        ({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "RANK/MASTER_PORT are not"),
        ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT is not"),
    ],
)
def test_world_size_without_a_launcher_is_a_usage_error_before_any_group(env, missing):
    # Typed by hand or left in a shell: torch would fail in env:// rendezvous, or wait for peers forever.
    with pytest.raises(
        LaunchEnvError, match=f"WORLD_SIZE=2 is set but {missing}: start the processes with torchrun"
    ):
        LaunchEnv.from_environ(env)
    assert issubclass(LaunchEnvError, ParallelismError)  # a CLI exits 2 on it


def test_a_hand_made_complete_launch_env_is_accepted():
    # A batch script exporting all four itself (no TORCHELASTIC_RUN_ID) is a valid env:// launch.
    env = LaunchEnv.from_environ(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    )
    assert (env.rank, env.world_size, env.master_port) == (1, 2, 29500)
    assert LaunchEnv.from_environ({"WORLD_SIZE": "1"}).world_size == 1


def test_single_process_runtime_has_no_process_group():
    rt = init_runtime(launch=LaunchEnv())
    assert not dist.is_initialized()
    assert (rt.rank, rt.world_size, rt.dp_rank, rt.dp_world_size, rt.backend, rt.mesh) == (
        0,
        1,
        0,
        1,
        None,
        None,
    )
    assert rt.is_main and not rt.is_distributed and rt.mode == "single" and rt.dp_group is None
    acc = torch.accelerator.current_accelerator(check_available=True)
    assert rt.device == (torch.device("cpu") if acc is None else torch.device(acc.type, 0))
    assert "world 1 (single" in rt.describe()


def test_timeout_comes_from_accelerator_config():
    rt = init_runtime(accelerator=AcceleratorConfig(timeout_s=42.0), launch=LaunchEnv())
    assert rt.timeout_s == 42.0


def test_topology_is_resolved_before_any_process_group():
    # 3 processes cannot be 2 x 2: the error must come before a rendezvous (which would need peers).
    launch = LaunchEnv(rank=0, world_size=3, master_addr="127.0.0.1", master_port=1)
    with pytest.raises(ParallelismError, match="product must equal the world size"):
        init_runtime(ParallelismConfig(dp_replicate=2, dp_shard=2), launch=launch, device="cpu")
    assert not dist.is_initialized()


def test_multi_process_launch_without_master_address_is_explained():
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        init_runtime(launch=LaunchEnv(rank=0, world_size=2), device="cpu")


def test_device_choice():
    assert resolve_device("cpu", 0) == torch.device("cpu")
    if torch.accelerator.is_available():
        assert resolve_device("auto", 0) == torch.device(torch.accelerator.current_accelerator().type, 0)
    else:
        assert resolve_device("auto", 1, 2) == torch.device("cpu")
        assert resolve_device(None, 0) == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no cuda device is available"):
            resolve_device("cuda", 0)


def test_backend_choice():
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "nccl"
    # FSDP2 with CPU offload reduces host tensors (sharded grads, their norm): gloo beside nccl
    assert backend_for(torch.device("cuda", 0), cpu_collectives=True) == "cuda:nccl,cpu:gloo"
    assert backend_for(torch.device("cpu"), cpu_collectives=True) == "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_adopts_a_foreign_process_group_and_leaves_it_alone(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with parallel_session(launch=LaunchEnv(), device="cpu", settle_s=0) as rt:
            assert not rt.owns_process_group and rt.world_size == 1
        assert dist.is_initialized(), "a group we did not create was destroyed"
        assert not shutdown_process_group(rt, settle_s=0)
    finally:
        dist.destroy_process_group()


def test_session_tears_down_its_own_group(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    rt = ParallelRuntime(
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
        parallelism=ParallelismConfig(),
        mesh=None,
        owns_process_group=True,
    )
    assert shutdown_process_group(rt, settle_s=0.01)
    assert not dist.is_initialized()
    assert not shutdown_process_group(rt, settle_s=0)  # idempotent


def test_session_reraises_and_cleans_up():
    with (
        pytest.raises(RuntimeError, match="boom"),
        parallel_session(launch=LaunchEnv(), device="cpu", settle_s=0),
    ):
        raise RuntimeError("boom")
    assert not dist.is_initialized()


def test_wrap_single_process_returns_the_plain_module():
    model = torch.nn.Linear(3, 2)
    rt = ParallelRuntime.single("cpu")
    wrapped = wrap_model(model, rt, build_plan(model, rt))
    assert isinstance(wrapped, WrappedModel) and wrapped.model is model and wrapped.module is model
    assert wrapped.runtime is rt and wrapped.ignored == ()
    with wrapped.gradient_sync(enabled=False):  # nothing to suppress: still computes gradients
        wrapped.model(torch.ones(1, 3)).sum().backward()
    assert model.weight.grad is not None
    assert wrapped.parameters_for_clipping() == [model.weight, model.bias]


def test_the_runtime_decides_the_topology_once():
    """Degrees resolved for the world size, and one definition of the mesh dims for mesh and plan."""
    from lerobot_parallel.testing import BlockRegressor

    with pytest.raises(ParallelismError, match="resolved for that world size"):
        ParallelRuntime(
            rank=0,
            world_size=4,
            local_rank=0,
            device=torch.device("cpu"),
            backend=None,
            parallelism=ParallelismConfig(dp_shard=2),
            mesh=None,
        )
    dims = {
        (r, s): ParallelRuntime.preview(ParallelismConfig(dp_replicate=r, dp_shard=s)).mesh_dims
        for r, s in ((1, 1), (2, 1), (1, 2), (2, 2))
    }
    assert dims == {
        (1, 1): (("dp_replicate", 1),),
        (2, 1): (("dp_replicate", 2),),
        (1, 2): (("dp_shard", 2),),
        (2, 2): (("dp_replicate", 2), ("dp_shard", 2)),
    }
    preview = ParallelRuntime.preview(ParallelismConfig(dp_replicate=2, dp_shard=2))
    assert (preview.world_size, preview.mesh, preview.mode) == (4, None, "hsdp")
    plan = build_plan(BlockRegressor(), preview)
    assert tuple(zip(plan.mesh_dim_names, plan.mesh_shape, strict=True)) == preview.mesh_dims
    with pytest.raises(ParallelismError, match="ParallelRuntime.preview is for planning only"):
        wrap_model(BlockRegressor(), preview, plan)


@pytest.mark.parametrize("degrees", [(1, 2), (2, 2)])
def test_sharded_request_is_checked_before_any_collective(degrees):
    """No mesh or process group is needed to refuse a model without wrap units, or a plan built for
    another topology: every rank fails the same way before the first all-gather."""
    from lerobot_parallel import ShardingError
    from lerobot_parallel.testing import BlockRegressor

    r, s = degrees
    rt = ParallelRuntime(
        rank=0,
        world_size=r * s,
        local_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
        parallelism=ParallelismConfig(dp_replicate=r, dp_shard=s),
        mesh=None,
    )
    with pytest.raises(ParallelismError, match="needs wrap units"):
        build_plan(torch.nn.Linear(2, 2), rt)
    other = build_plan(BlockRegressor(), ParallelRuntime.preview(ParallelismConfig(dp_shard=8)))
    with pytest.raises(ShardingError, match="plan was built for fsdp"):
        wrap_model(BlockRegressor(), rt, other)


def test_effective_batch():
    assert effective_batch_size(8, 2, 4) == 64
    assert samples_per_loop_step(8, 2) == 16
    assert effective_batch_line(8, 2, 4) == "Effective batch size: 8 x 2 dp workers x 4 grad accum = 64"
    assert effective_batch_line(32, 1) == "Effective batch size: 32 x 1 dp workers x 1 grad accum = 32"
    with pytest.raises(ValueError, match="grad_accum_steps"):
        effective_batch_size(8, 2, 0)
