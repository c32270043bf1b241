"""pi0/pi05 as LeRobot 0.6.1 computes them in the cases its users run beyond one fp32 ``observation.images.*``
camera: which parameters ``--policy.dtype=bfloat16`` casts (and so the dtype each key is saved in), cameras
named anything, and LeRobot checkpoints carrying ``empty_cameras`` placeholders. The numbers themselves
(loss, action chunk, every gradient, fp32 and bf16) are compared with LeRobot's in
tools/interop/pi0_lerobot_interop.py and pi05_lerobot_interop.py; these tests need no LeRobot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.common.paligemma.policy import resize_with_pad
from lerobot_cli.policies.pi0.config import PI0Config
from lerobot_cli.policies.pi0.modeling import PI0Policy
from lerobot_cli.policies.pi05.config import PI05Config
from lerobot_cli.policies.pi05.modeling import PI05Policy
from lerobot_cli.policies.weights import load_policy, save_pretrained
from safetensors import safe_open

DEMO = Path(__file__).resolve().parents[3] / "data" / "lerobot" / "demo_reach"
TOWERS = "model.paligemma_with_expert."
TINY = {
    "paligemma_variant": "gemma_tiny",
    "action_expert_variant": "gemma_tiny",
    "vision_variant": "tiny",
    "image_resolution": (56, 56),
    "chunk_size": 4,
    "n_action_steps": 4,
    "tokenizer_max_length": 8,
}
STATE_ACTION = {
    "input_features": {"observation.state": PolicyFeature(FeatureType.STATE, (6,))},
    "output_features": {"action": PolicyFeature(FeatureType.ACTION, (6,))},
}
KINDS = {"pi0": (PI0Config, PI0Policy), "pi05": (PI05Config, PI05Policy)}


def _config(kind: str, cameras: dict[str, tuple[int, int, int]], **overrides):
    inputs = {key: PolicyFeature(FeatureType.VISUAL, shape) for key, shape in cameras.items()}
    return KINDS[kind][0](
        **TINY,
        input_features={**inputs, **STATE_ACTION["input_features"]},
        output_features=STATE_ACTION["output_features"],
        **overrides,
    )


def _batch(cameras: dict[str, tuple[int, int, int]], seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        **{key: torch.rand(2, *shape, generator=g) for key, shape in cameras.items()},
        "observation.state": torch.randn(2, 6, generator=g),
        "action": torch.randn(2, 4, 6, generator=g),
        "observation.language.tokens": torch.randint(0, 300, (2, 8), generator=g),
        "observation.language.attention_mask": torch.arange(8)[None] < torch.tensor([[8], [1]]),
    }


def lerobot_bf16_dtype(key: str) -> torch.dtype:
    """The dtype LeRobot 0.6.1 gives ``key`` under dtype=bfloat16, spelled out from its modeling_pi0/pi05:
    ``PaliGemmaWithExpertModel.to_bfloat16_for_selected_params`` casts the towers to bf16 except the vision
    tower, the projector and every norm (adaptive ones' ``dense`` included); the flow model's own
    projections (state/action in/out, the time MLPs) are built after it and stay fp32."""
    if not key.startswith(TOWERS):
        return torch.float32
    inside = key.removeprefix(TOWERS)
    fp32 = (
        "vision_tower." in inside
        or "multi_modal_projector." in inside
        or "layernorm." in inside
        or inside.endswith(("model.norm.weight", "model.norm.dense.weight", "model.norm.dense.bias"))
    )
    return torch.float32 if fp32 else torch.bfloat16


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_bfloat16_casts_what_lerobot_casts_and_saves_each_key_in_its_dtype(kind, tmp_path):
    """Before: the whole flow model was cast, so action_in/out_proj, state_proj and the time MLPs trained
    and were saved in bf16 (LeRobot keeps them fp32), and a LeRobot fp32 file lost their low bits on load."""
    cameras = {"observation.images.top": (3, 56, 56)}
    torch.manual_seed(0)
    policy = KINDS[kind][1](_config(kind, cameras, dtype="bfloat16"))
    expected = {key: lerobot_bf16_dtype(key) for key in policy.state_dict()}
    assert {key: value.dtype for key, value in policy.state_dict().items()} == expected
    assert expected["model.action_in_proj.weight"] == torch.float32
    assert expected[TOWERS + "gemma_expert.model.layers.0.self_attn.q_proj.weight"] == torch.bfloat16
    save_pretrained(policy, policy.config, tmp_path / "saved")
    with safe_open(str(tmp_path / "saved" / "model.safetensors"), "pt") as f:
        saved = {key: f.get_slice(key).get_dtype() for key in f.keys()}  # noqa: SIM118 - safe_open has no iterator
    assert saved == {key: "BF16" if dtype == torch.bfloat16 else "F32" for key, dtype in expected.items()}

    # A LeRobot fp32 checkpoint fine-tuned with --policy.dtype=bfloat16: the fp32 parts keep every bit.
    torch.manual_seed(1)
    fp32 = KINDS[kind][1](_config(kind, cameras))
    save_pretrained(fp32, fp32.config, tmp_path / "fp32")
    _, loaded = load_policy(tmp_path / "fp32", config=_config(kind, cameras, dtype="bfloat16"))
    for key, value in fp32.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value.to(expected[key])), key


@pytest.mark.parametrize("kind", ["pi0", "pi05"])
def test_every_visual_input_is_a_camera_in_the_configs_order_whatever_its_name(kind):
    """Before: only keys starting with observation.image were used; observation.wrist_rgb was dropped
    without a word (LeRobot uses every VISUAL feature: loss off by 4e-2, actions by 0.21)."""
    cameras = {"observation.wrist_rgb": (3, 48, 64), "observation.images.top": (3, 64, 40)}
    torch.manual_seed(0)
    policy = KINDS[kind][1](_config(kind, cameras, empty_cameras=1))
    batch = _batch(cameras)
    images, masks = policy._images(batch)
    assert len(images) == 3 and [bool(m.all()) for m in masks] == [True, True] + [False]
    for image, key in zip(images, cameras, strict=False):  # config order, each resized with padding
        assert torch.equal(image, resize_with_pad(batch[key], 56, 56) * 2.0 - 1.0), key
    assert torch.equal(images[2], torch.full_like(images[0], -1.0))
    noise, time = torch.randn(2, 4, 32), torch.full((2,), 0.5)
    loss, _ = policy(batch, noise=noise, time=time)
    other = {**batch, "observation.wrist_rgb": 1.0 - batch["observation.wrist_rgb"]}
    assert not torch.equal(policy(other, noise=noise, time=time)[0], loss)  # the wrist camera is seen


def _lerobot_style_checkpoint(directory: Path, tokenizer: Path, extra_camera: str) -> Path:
    """A pi0 ``pretrained_model/`` for the demo dataset as LeRobot writes one trained with
    ``--policy.empty_cameras=1``: its ``validate_features`` put the placeholder into ``input_features``."""
    config = PI0Config(
        **TINY,
        empty_cameras=1,
        tokenizer_name=str(tokenizer),
        input_features={
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 64, 64)),
            "observation.state": PolicyFeature(FeatureType.STATE, (2,)),
            extra_camera: PolicyFeature(FeatureType.VISUAL, (3, 56, 56)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (2,))},
    )
    torch.manual_seed(0)
    save_pretrained(PI0Policy(config), config, directory)
    assert extra_camera in json.loads((directory / "config.json").read_text())["input_features"]
    return directory


def _workload(checkpoint: Path):
    from lerobot_cli.cli.build import build_train_config
    from lerobot_cli.workload import build_workload

    flags = {
        "dataset.repo_id": "lerobot/demo_reach",
        "dataset.root": str(DEMO),
        "policy.path": str(checkpoint),
    }
    return build_workload(build_train_config(flags).config.finalized(), device="cpu")


def test_lerobot_checkpoint_with_an_empty_camera_trains_on_its_own_dataset(tmp_path, tiny_tokenizer_dir):
    """Before: --policy.path refused it ('observation.images.empty_camera_0 is missing; use the dataset
    that policy was trained on') on the very dataset it was trained on; LeRobot's make_policy accepts it
    and masks the absent camera, and so do we. A real camera the dataset lacks is still refused."""
    checkpoint = _lerobot_style_checkpoint(
        tmp_path / "lerobot", tiny_tokenizer_dir, "observation.images.empty_camera_0"
    )
    workload = _workload(checkpoint)
    sample = workload.dataset[0]
    batch = workload.preprocessor(
        {k: v[None] if isinstance(v, torch.Tensor) else [v] for k, v in sample.items()}
    )
    images, masks = workload.policy._images(batch)
    assert len(images) == 2 and bool(masks[0].all()) and not bool(masks[1].any())
    assert torch.isfinite(workload.policy.train()(batch)[0])

    wrong = _lerobot_style_checkpoint(tmp_path / "wrist", tiny_tokenizer_dir, "observation.images.wrist")
    from lerobot_cli.datasets import DatasetError

    with pytest.raises(
        DatasetError, match=r"observation.images.wrist is missing; use the dataset that policy was"
    ):
        _workload(wrong)


def test_banner_says_when_trainable_parameters_have_no_fp32_masters(tiny_tokenizer_dir):
    """--policy.dtype=bfloat16 without mixed precision updates bf16 values (LeRobot's bf16 training): the
    banner says so and names the flag that keeps fp32 masters, which it then does in every layout (one
    process and DDP here; FSDP2 upcasts before sharding). Before: 'Precision: bf16 (autocast, fp32 master
    weights)' was printed for such a policy on one process while its trainable weights stayed bf16."""
    from lerobot_cli.banner import precision_line
    from lerobot_cli.cli.build import build_train_config
    from lerobot_cli.datasets import load_meta
    from lerobot_cli.workload import build_policy_for

    flags = {
        "dataset.repo_id": "lerobot/demo_reach",
        "dataset.root": str(DEMO),
        "policy.type": "pi0",
        **{f"policy.{k}": json.dumps(list(v)) if isinstance(v, tuple) else str(v) for k, v in TINY.items()},
        "policy.tokenizer_name": str(tiny_tokenizer_dir),
        "policy.dtype": "bfloat16",
    }
    features = load_meta(DEMO).features
    for mixed_precision in ("no", "bf16"):
        cfg = build_train_config({**flags, "accelerator.mixed_precision": mixed_precision}).config.finalized()
        _, policy = build_policy_for(cfg, features)
        trainable = {p.dtype for p in policy.parameters() if p.requires_grad}
        frozen = {p.dtype for p in policy.parameters() if not p.requires_grad}
        line = precision_line(mixed_precision, policy)
        if mixed_precision == "no":
            assert trainable == {torch.bfloat16, torch.float32}
            assert (
                line.startswith("Precision: no; ")
                and " trainable parameters are bfloat16 without fp32 master weights" in line
                and line.endswith("; --accelerator.mixed_precision=bf16 keeps fp32 masters")
            ), line
        else:
            assert trainable == {torch.float32} and torch.bfloat16 in frozen  # the unread lm_heads keep bf16
            assert line == "Precision: bf16 (autocast, fp32 master weights)"
    assert (
        precision_line("no", PI0Policy(_config("pi0", {"observation.images.top": (3, 56, 56)})))
        == "Precision: no"
    )
