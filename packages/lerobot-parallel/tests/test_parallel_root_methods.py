"""The root methods ``apply_sharding`` registers as FSDP forward methods (``root_forward_methods``).

The multi-process proof that a registered ``predict_action_chunk`` gathers the root is
tests/test_fastwam_inference.py (FastWAM on FSDP2 x2 equals one process bit for bit; unregistered, the
proprio encoder's shards meet a plain tensor and it fails)."""

from __future__ import annotations

from typing import ClassVar

from lerobot_parallel.sharding import ROOT_FORWARD_METHODS, root_forward_methods
from torch import nn


class Policy(nn.Module):
    def forward(self, batch):
        return batch

    def predict_action_chunk(self, batch):
        return batch

    def select_action(self, batch):
        return batch


class Generator(Policy):
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("generate", "select_action")

    def generate(self, batch):
        return batch


class Wrapper(nn.Module):
    """Forwards unknown attributes to its model, as a PEFT ``PeftModel`` does."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)


def test_lerobots_inference_methods_are_registered_when_the_root_has_them():
    assert ROOT_FORWARD_METHODS == ("predict_action_chunk", "select_action")
    # its own select_action refills through the registered predict_action_chunk: registering both would
    # nest the root's hooks (a reshard at the outer exit, an all-gather at every pop)
    assert root_forward_methods(Policy()) == ("predict_action_chunk",)
    assert root_forward_methods(nn.Linear(2, 2)) == ()  # not a policy: nothing to register


def test_a_root_class_adds_its_own_methods_once():
    assert root_forward_methods(Generator()) == ("predict_action_chunk", "generate", "select_action")


def test_a_wrapper_forwarding_attributes_registers_its_policys_methods():
    assert root_forward_methods(Wrapper(Policy())) == ROOT_FORWARD_METHODS
