"""``keep_host_values``: the pre-hooks around a sharded root's input move. FSDP2's root pre-forward copies
every input tensor to a CUDA device (torch has no option to leave one alone); here a hook that moves every
tensor to the ``meta`` device stands in for it, so a CPU test sees what would reach the device. The real
FSDP2 root with ``apply_sharding``: test_parallel_apply_sharding.py."""

from __future__ import annotations

from collections import OrderedDict

import torch
from lerobot_parallel.host_values import HOST_KEYS, keep_host_values
from torch import nn

META = torch.device("meta")


class Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple] = []

    def forward(self, batch, extra=None):
        self.seen.append((batch, extra))
        return batch


def mover(module, args, kwargs):
    """Every tensor of every mapping argument to the device, as FSDP2's root pre-forward does."""

    def move(value):
        if isinstance(value, dict):
            return type(value)(
                (k, v.to(META) if isinstance(v, torch.Tensor) else v) for k, v in value.items()
            )
        return value

    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def test_host_values_skip_the_input_move_and_come_back_in_place():
    assert HOST_KEYS == frozenset({"index"})
    root = Recorder()
    root.register_forward_pre_hook(mover, prepend=True, with_kwargs=True)  # as fully_shard registers it
    keep_host_values(root)
    index, other = torch.arange(3), torch.arange(2)
    batch = OrderedDict(x=torch.ones(3, 2), index=index, task=["a", "b", "c"])
    root(batch, extra={"index": other, "y": torch.zeros(1)})
    seen, extra = root.seen[-1]
    assert type(seen) is OrderedDict and list(seen) == ["x", "index", "task"]  # same keys, same order
    assert seen["x"].device == META and seen["index"] is index and seen["task"] == ["a", "b", "c"]
    assert extra["y"].device == META and extra["index"] is other  # keyword arguments alike
    assert list(batch) == ["x", "index", "task"] and batch["x"].device.type == "cpu"  # the caller's dict

    root({"x": torch.ones(1)})  # nothing to hold: the call goes through as it was
    assert root.seen[-1][0]["x"].device == META and "index" not in root.seen[-1][0]


def test_without_the_hooks_the_move_takes_the_index():
    root = Recorder()
    root.register_forward_pre_hook(mover, prepend=True, with_kwargs=True)
    root({"index": torch.arange(3)})
    assert root.seen[-1][0]["index"].device == META  # what keep_host_values prevents
