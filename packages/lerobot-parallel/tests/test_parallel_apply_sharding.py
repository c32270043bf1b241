"""``apply_sharding`` itself registers the methods that run instead of ``forward``: on the root, the
policy's ``predict_action_chunk`` (its own ``select_action`` refills through it, so not that one), on a
unit member its class's ``_fsdp_forward_methods`` (pi0's ``joint``).

In one process on a 1-rank gloo mesh: FSDP2 shards the parameters into ``DTensor``s all the same, so a
method FSDP does not gather meets them as shards and fails on a plain tensor ("mixed torch.Tensor and
DTensor"), exactly as on N ranks. The selection alone: test_parallel_root_methods.py; on FSDP2 x2 with
the real FastWAM: tests/test_fastwam_inference.py."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
import torch.distributed as dist
from lerobot_parallel.config import AcceleratorConfig, FSDPConfig, ParallelismConfig
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.sharding import apply_sharding
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor


class Joint(nn.Module):
    """A unit whose ``joint`` runs instead of ``forward`` (as pi0's joint layer)."""

    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("joint",)

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)

    def joint(self, x):
        return self.linear(x) * 2


class Policy(nn.Module):
    """A root parameter no unit takes (``head``), read by the inference entry points."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Joint() for _ in range(2))
        self.head = nn.Linear(4, 2)
        self.chunks = 0

    def forward(self, x):
        return self.head(self.blocks[1](self.blocks[0](x))).sum()

    def predict_action_chunk(self, x):
        self.chunks += 1
        return self.head(self.blocks[1].joint(self.blocks[0].joint(x)))

    def select_action(self, x):  # refills through the registered method, as LeRobot's policies do
        return self.predict_action_chunk(x)[:, 0]


@pytest.fixture
def one_rank_mesh(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))
    finally:
        dist.destroy_process_group()


def test_apply_sharding_registers_the_roots_and_the_units_forward_methods(one_rank_mesh):
    reference = Policy()
    x = torch.randn(3, 4)
    expected_chunk = reference.predict_action_chunk(x).detach()
    model = Policy()
    # planned as for 2 ranks (a 1-rank plan shards nothing), applied on this 1-rank mesh
    preview = ParallelRuntime.preview(ParallelismConfig(dp_shard=2).resolve(2))
    plan = build_plan(model, preview, AcceleratorConfig(fsdp=FSDPConfig(wrap_modules=["Joint"])))
    runtime = ParallelRuntime(
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
        parallelism=ParallelismConfig(dp_shard=1).resolve(1),
        mesh=one_rank_mesh,
    )
    sharded, ignored = apply_sharding(model, runtime, plan)
    assert sharded is model and ignored == ()
    assert isinstance(model.head.weight, DTensor)  # the root's own parameter is a shard until gathered

    with torch.no_grad():
        chunk = model.predict_action_chunk(x)  # gathers the root, then each unit through joint
        action = model.select_action(x)
    assert not isinstance(chunk, DTensor) and torch.equal(chunk, expected_chunk)
    assert torch.equal(action, expected_chunk[:, 0]) and model.chunks == 2
    model(x).backward()  # training still works after inference, and inference after training
    with torch.no_grad():
        assert torch.equal(model.predict_action_chunk(x), expected_chunk)

    # registered on the instance; select_action not also, which would nest the root's hooks
    registered = {name for name in ("predict_action_chunk", "select_action") if name in vars(model)}
    assert registered == {"predict_action_chunk"}
    assert all("joint" in vars(block) for block in model.blocks)


class BatchPolicy(Policy):
    """Takes a batch dict and notes the ``index`` it got, as pi0/diffusion/FastWAM read it."""

    def forward(self, batch):
        self.indices = getattr(self, "indices", []) + [batch["index"]]
        return super().forward(batch["x"])


def test_the_sharded_roots_input_move_leaves_the_index_on_the_host(one_rank_mesh, monkeypatch):
    """FSDP2's root pre-forward copies every input tensor to a CUDA device (``_to_kwargs``); on CPU it
    skips that, so the device check is made to pass (a privateuse1 backend named ``cpu``) and the tensors
    handed to the move are recorded."""
    import torch.distributed.fsdp._fully_shard._fsdp_state as fsdp_state

    handed: list[torch.Tensor] = []
    real_to_kwargs = fsdp_state._to_kwargs

    def to_kwargs(args, kwargs, device, use_side_stream):
        for value in [*args, *kwargs.values()]:
            handed.extend(
                v for v in (value.values() if isinstance(value, dict) else [value]) if torch.is_tensor(v)
            )
        return real_to_kwargs(args, kwargs, device, use_side_stream)

    monkeypatch.setattr(fsdp_state, "_to_kwargs", to_kwargs)
    model = BatchPolicy()
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "cpu")  # after the seeding
    preview = ParallelRuntime.preview(ParallelismConfig(dp_shard=2).resolve(2))
    plan = build_plan(model, preview, AcceleratorConfig(fsdp=FSDPConfig(wrap_modules=["Joint"])))
    runtime = ParallelRuntime(
        rank=0,
        world_size=1,
        local_rank=0,
        device=torch.device("cpu"),
        backend="gloo",
        parallelism=ParallelismConfig(dp_shard=1).resolve(1),
        mesh=one_rank_mesh,
    )
    apply_sharding(model, runtime, plan)
    x, index = torch.randn(3, 4), torch.arange(3)
    model({"x": x, "index": index}).backward()
    assert any(t is x for t in handed)  # the move ran on the batch
    assert not any(t is index for t in handed), "FSDP's root input move got the index"
    assert model.indices == [index] and model.indices[0] is index
