"""Diffusion Policy's camera encoder: resize/crop, a ResNet trunk, spatial softmax, one linear layer.

The trunk is torchvision's ResNet up to ``layer4`` kept as LeRobot keeps it, an ``nn.Sequential`` of
torchvision's children (``backbone.0`` = conv1, ``.1`` = bn1, ``.4``–``.7`` = layer1–layer4), so
checkpoint keys equal LeRobot's. Unlike ACT's trunk its batch norms *train* (LeRobot's diffusion uses
plain ``nn.BatchNorm2d``), or are group norms with ``use_group_norm`` (``C // 16`` groups). torchvision
is not a dependency (see ``policies/act/backbone.py``); resize and crops follow torchvision's tensor
transforms (bilinear with antialias, center crop rounding, one random offset per batch).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.policies.backbone_weights import read_backbone_state, resolve_backbone_weights
from lerobot_cli.policies.diffusion.config import DiffusionConfig

_ARCHS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
    "resnet152": ("bottleneck", (3, 8, 36, 3)),
}
# torchvision's children names -> index in LeRobot's Sequential trunk
_TRUNK_INDEX = {"conv1": 0, "bn1": 1, "layer1": 4, "layer2": 5, "layer3": 6, "layer4": 7}


class BatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` (same state) that also runs when FSDP2 gathers its affine terms in bf16 while the
    running statistics, buffers, stay float32: it then normalises in the statistics' dtype. Otherwise it
    is ``nn.BatchNorm2d`` exactly."""

    def forward(self, x: Tensor) -> Tensor:
        stats = self.running_mean
        if self.weight is None or stats is None or self.weight.dtype == stats.dtype:
            return super().forward(x)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        out = F.batch_norm(
            x.to(stats.dtype),
            stats,
            self.running_var,
            self.weight.to(stats.dtype),
            self.bias.to(stats.dtype),
            self.training,
            factor,
            self.eps,
        )
        return out.to(x.dtype)


def _norm(channels: int, group_norm: bool) -> nn.Module:
    return nn.GroupNorm(channels // 16, channels) if group_norm else BatchNorm2d(channels)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(
        self, cin: int, planes: int, stride: int, downsample: nn.Module | None, group_norm: bool
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _norm(planes, group_norm)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = _norm(planes, group_norm)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self, cin: int, planes: int, stride: int, downsample: nn.Module | None, group_norm: bool
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = _norm(planes, group_norm)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _norm(planes, group_norm)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = _norm(planes * 4, group_norm)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


def resnet_trunk(arch: str, group_norm: bool) -> tuple[nn.Sequential, int]:
    """``(trunk, out_channels)``: conv1, bn1, relu, maxpool, layer1..layer4 (torchvision's init)."""
    kind, counts = _ARCHS[arch]
    block = BasicBlock if kind == "basic" else Bottleneck
    cin, stages = 64, []
    for i, (planes, count) in enumerate(zip((64, 128, 256, 512), counts, strict=True)):
        stride = 1 if i == 0 else 2
        downsample = None
        if stride != 1 or cin != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(cin, planes * block.expansion, 1, stride=stride, bias=False),
                _norm(planes * block.expansion, group_norm),
            )
        blocks = [block(cin, planes, stride, downsample, group_norm)]
        cin = planes * block.expansion
        blocks += [block(cin, planes, 1, None, group_norm) for _ in range(1, count)]
        stages.append(nn.Sequential(*blocks))
    trunk = nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        _norm(64, group_norm),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
        *stages,
    )
    for m in trunk.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return trunk, cin


def trunk_output_hw(h: int, w: int) -> tuple[int, int]:
    """Feature-map size after the trunk: five stride-2 stages (conv1, maxpool, layer2-4), each ⌊(n-1)/2⌋+1."""
    for _ in range(5):
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    return h, w


def load_trunk_weights(trunk: nn.Sequential, spec: str) -> None:
    """A torchvision ResNet state dict (``--policy.pretrained_backbone_weights``) into the trunk."""
    file = resolve_backbone_weights(spec)
    state = read_backbone_state(file)
    mapped = {}
    for key, value in state.items():
        head, _, rest = key.partition(".")
        if head in _TRUNK_INDEX:
            mapped[f"{_TRUNK_INDEX[head]}.{rest}"] = value
        elif head.isdigit():  # already in the trunk's own names
            mapped[key] = value
    result = trunk.load_state_dict(mapped, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("num_batches_tracked")]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{file} does not fit a {len(trunk)}-child ResNet trunk: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )


class SpatialSoftmax(nn.Module):
    """Keypoints as the softmax-weighted mean pixel position of each channel (after a 1x1 conv to
    ``num_kp`` channels); coordinates in [-1, 1] on a numpy meshgrid, as LeRobot (and robomimic)."""

    def __init__(self, input_shape: tuple[int, int, int], num_kp: int | None = None) -> None:
        super().__init__()
        channels, self._h, self._w = input_shape
        self.nets = nn.Conv2d(channels, num_kp, kernel_size=1) if num_kp is not None else None
        self._out_c = num_kp if num_kp is not None else channels
        pos_x, pos_y = np.meshgrid(np.linspace(-1.0, 1.0, self._w), np.linspace(-1.0, 1.0, self._h))
        grid = np.concatenate([pos_x.reshape(-1, 1), pos_y.reshape(-1, 1)], axis=1)
        self.register_buffer("pos_grid", torch.from_numpy(grid).float())

    def forward(self, features: Tensor) -> Tensor:
        if self.nets is not None:
            features = self.nets(features)
        attention = F.softmax(features.reshape(-1, self._h * self._w), dim=-1)
        return (attention @ self.pos_grid).view(-1, self._out_c, 2)


def center_crop(x: Tensor, size: tuple[int, int]) -> Tensor:
    h, w = x.shape[-2:]
    top, left = round((h - size[0]) / 2.0), round((w - size[1]) / 2.0)  # Python rounding, as torchvision
    return x[..., top : top + size[0], left : left + size[1]]


def random_crop(x: Tensor, size: tuple[int, int]) -> Tensor:
    """One random window for the whole batch; draws nothing when the crop is the whole image."""
    h, w = x.shape[-2:]
    if (h, w) == tuple(size):
        return x
    top = int(torch.randint(0, h - size[0] + 1, size=(1,)).item())
    left = int(torch.randint(0, w - size[1] + 1, size=(1,)).item())
    return x[..., top : top + size[0], left : left + size[1]]


class DiffusionRgbEncoder(nn.Module):
    """``(B, C, H, W)`` images (already normalised) -> ``(B, 2 · num_keypoints)`` features."""

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__()
        self.resize_shape = tuple(config.resize_shape) if config.resize_shape is not None else None
        self.crop_shape = tuple(config.crop_shape) if config.crop_shape is not None else None
        self.crop_is_random = config.crop_is_random
        self.backbone, channels = resnet_trunk(config.vision_backbone, config.use_group_norm)
        if config.pretrained_backbone_weights:
            load_trunk_weights(self.backbone, config.pretrained_backbone_weights)
        image_shape = next(iter(config.image_features.values())).shape
        hw = self.crop_shape or self.resize_shape or tuple(image_shape[1:])
        self.pool = SpatialSoftmax(
            (channels, *trunk_output_hw(*hw)), num_kp=config.spatial_softmax_num_keypoints
        )
        self.feature_dim = config.spatial_softmax_num_keypoints * 2
        self.out = nn.Linear(config.spatial_softmax_num_keypoints * 2, self.feature_dim)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        if self.resize_shape is not None:
            x = F.interpolate(x, size=self.resize_shape, mode="bilinear", align_corners=False, antialias=True)
        if self.crop_shape is not None:
            x = (
                random_crop(x, self.crop_shape)
                if self.training and self.crop_is_random
                else center_crop(x, self.crop_shape)
            )
        x = torch.flatten(self.pool(self.backbone(x)), start_dim=1)
        return self.relu(self.out(x))
