"""ResNet backbone: frozen BN math, torchvision-format weight files (the name lookup and download:
test_policy_backbone_weights.py)."""

from __future__ import annotations

import pytest
import torch
from lerobot_cli.policies.act.backbone import (
    FrozenBatchNorm2d,
    ResNetFeatureMap,
    load_backbone_weights,
)
from lerobot_cli.policies.act.embeddings import ACTSinusoidalPositionEmbedding2d, sinusoidal_embedding_1d


def test_frozen_batchnorm_equals_eval_batchnorm():
    bn = torch.nn.BatchNorm2d(5).eval()
    with torch.no_grad():
        for t in (bn.weight, bn.bias, bn.running_mean):
            t.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    frozen = FrozenBatchNorm2d(5)
    frozen.load_state_dict(bn.state_dict())  # num_batches_tracked is dropped, not an error
    x = torch.randn(2, 5, 4, 4)
    torch.testing.assert_close(frozen(x), bn(x))
    assert not list(frozen.parameters())


def test_resnet18_feature_map_shape_and_torchvision_names():
    net = ResNetFeatureMap("resnet18")
    assert net.out_channels == 512
    assert net(torch.rand(1, 3, 64, 64)).shape == (1, 512, 2, 2)  # stride 32
    names = set(net.state_dict())
    assert {
        "conv1.weight",
        "bn1.running_var",
        "layer4.1.conv2.weight",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.running_mean",
    } <= names
    assert not any(n.startswith(("fc.", "avgpool")) for n in names)


def test_dilated_bottleneck_keeps_stride_16():
    net = ResNetFeatureMap("resnet50", dilate_last_stage=True)
    assert net.out_channels == 2048
    assert net(torch.rand(1, 3, 64, 64)).shape == (1, 2048, 4, 4)
    assert net.layer4[1].conv2.dilation == (2, 2)


def _torchvision_style_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    state = {k: torch.randn_like(v) for k, v in ResNetFeatureMap("resnet18").state_dict().items()}
    state.update(
        {
            "fc.weight": torch.randn(1000, 512),
            "fc.bias": torch.randn(1000),
            "bn1.num_batches_tracked": torch.tensor(7),
        }
    )
    return state


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_local_weights_file_loads(tmp_path, suffix):
    state = _torchvision_style_state(1)
    path = tmp_path / f"resnet{suffix}"
    if suffix == ".pth":
        torch.save(state, path)
    else:
        from safetensors.torch import save_file

        save_file({k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}, str(path))
    net = ResNetFeatureMap("resnet18")
    assert load_backbone_weights(net, str(path)) == path
    torch.testing.assert_close(net.state_dict()["layer3.1.conv1.weight"], state["layer3.1.conv1.weight"])


def test_wrong_weights_file_is_rejected(tmp_path):
    path = tmp_path / "r34.pth"
    torch.save(ResNetFeatureMap("resnet34").state_dict(), path)
    with pytest.raises(ValueError, match="does not fit"):
        load_backbone_weights(ResNetFeatureMap("resnet18"), str(path))


def test_position_embeddings():
    table = sinusoidal_embedding_1d(6, 8)
    assert table.shape == (6, 8)
    torch.testing.assert_close(table[0], torch.tensor([0.0, 1.0] * 4))  # position 0: sin 0, cos 0
    assert table[3, 0].item() == pytest.approx(torch.sin(torch.tensor(3.0)).item())
    pos = ACTSinusoidalPositionEmbedding2d(8)(torch.zeros(2, 5, 3, 4))
    assert pos.shape == (1, 16, 3, 4)
    # first half varies along rows only, second half along columns only
    assert torch.allclose(pos[0, :8, :, 0:1].expand(-1, -1, 4), pos[0, :8])
    assert torch.allclose(pos[0, 8:, 0:1, :].expand(-1, 3, -1), pos[0, 8:])
