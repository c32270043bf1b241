"""SmolVLA's training step reads nothing back from the device (a CUDA host sync stalls the step): every
tensor read during a forward and backward is counted (lerobot_trainloop.testing.HostSyncCounter). The
only reads are in the per-sample noise/time draw, on host tensors by construction (the dataset ``index``
stays in host memory, and the draws come from the CPU generator), so none would wait for a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from lerobot_cli.policies.smolvla.modeling import SmolVLAPolicy
from lerobot_trainloop.testing import HostSyncCounter

HERE = Path(__file__).resolve().parent


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMOLVLA = _load("smolvla_host_syncs_policy_tests", "test_policy_smolvla.py")


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> SmolVLAPolicy:
    vlm = _load("smolvla_host_syncs_vlm", "smolvlm_tiny.py").save_tiny_smolvlm(tmp_path_factory.mktemp("vlm"))
    torch.manual_seed(0)
    return SmolVLAPolicy(SMOLVLA.tiny(vlm, train_expert_only=False, freeze_vision_encoder=False))


def training_batch() -> dict:
    batch = SMOLVLA.batch()
    batch["action_is_pad"] = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 1]], dtype=torch.bool)
    batch["index"] = torch.tensor([5, 9, 11])  # host memory in the trainer (HOST_KEYS)
    return batch


def test_a_training_step_reads_the_device_only_in_the_host_side_noise_draw(policy, monkeypatch):
    where = {"draw": False}
    real_draw = SmolVLAPolicy._draw_noise_and_time

    def draw(self, *args, **kwargs):
        where["draw"] = True
        try:
            return real_draw(self, *args, **kwargs)
        finally:
            where["draw"] = False

    monkeypatch.setattr(SmolVLAPolicy, "_draw_noise_and_time", draw)
    batch = training_batch()
    with HostSyncCounter(label=lambda: "draw" if where["draw"] else "model") as counter:
        loss, _ = policy(batch)
        loss.backward()
    policy.zero_grad(set_to_none=True)
    assert counter.syncs("model") == []
    assert counter.syncs("draw")  # the index and the CPU generator's draws: host values


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_the_image_embedding_is_transformers_vision_model_bit_for_bit(policy, attention):
    """``embed_image`` skips the vision model's all-true mask check; the numbers are the vision model's."""
    towers = policy.model.vlm_with_expert
    vision = towers.vlm.model.vision_model
    saved = vision.config._attn_implementation
    vision.config._attn_implementation = attention
    try:
        image = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
        with torch.no_grad():
            ours = towers.embed_image(image)
            theirs = towers.vlm.model.connector(
                vision(pixel_values=image, patch_attention_mask=None).last_hidden_state
            )
    finally:
        vision.config._attn_implementation = saved
    assert torch.equal(ours, theirs)
