"""ResNet feature extractor for ACT's cameras, parameter-for-parameter compatible with torchvision.

torchvision is not a dependency (its wheels trail torch releases), so the ResNet is built here with the
same module names: a checkpoint's ``model.backbone.layer4.1.conv2.weight`` means the same tensor in
LeRobot and here, and a torchvision ImageNet state dict loads as is. Batch norm is frozen (statistics and
affine terms are buffers) exactly as LeRobot does, so the backbone keeps its pretrained statistics under
small robot batches and FSDP never shards BN state.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from lerobot_cli.policies.backbone_weights import read_backbone_state, resolve_backbone_weights


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine terms, all buffers (torchvision's names and eps)."""

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        # A trainable BatchNorm2d checkpoint carries a step counter that has no meaning here.
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def forward(self, x: Tensor) -> Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale[None, :, None, None] + shift[None, :, None, None]


def _conv3x3(cin: int, cout: int, stride: int = 1, dilation: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=dilation, dilation=dilation, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(
        self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None, dilation: int = 1
    ) -> None:
        super().__init__()
        if dilation > 1:
            raise ValueError("ResNet basic blocks (resnet18/34) do not support dilation")
        self.conv1 = _conv3x3(cin, planes, stride)
        self.bn1 = FrozenBatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = FrozenBatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None, dilation: int = 1
    ) -> None:
        super().__init__()
        self.conv1 = _conv1x1(cin, planes)
        self.bn1 = FrozenBatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride, dilation)
        self.bn2 = FrozenBatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = FrozenBatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


_ARCHS: dict[str, tuple[type[BasicBlock | Bottleneck], tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet101": (Bottleneck, (3, 4, 23, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


class ResNetFeatureMap(nn.Module):
    """A ResNet up to ``layer4`` (no pooling, no classifier): returns the last feature map.

    Child names equal torchvision's (and hence what LeRobot's ``IntermediateLayerGetter`` keeps).
    """

    def __init__(self, arch: str = "resnet18", dilate_last_stage: bool = False) -> None:
        super().__init__()
        if arch not in _ARCHS:
            raise ValueError(f"unsupported backbone {arch!r} (choose from {', '.join(_ARCHS)})")
        block, counts = _ARCHS[arch]
        self._cin, self._dilation = 64, 1
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = FrozenBatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(block, 64, counts[0], stride=1)
        self.layer2 = self._stage(block, 128, counts[1], stride=2)
        self.layer3 = self._stage(block, 256, counts[2], stride=2)
        self.layer4 = self._stage(block, 512, counts[3], stride=2, dilate=dilate_last_stage)
        self.out_channels = 512 * block.expansion
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _stage(self, block, planes: int, count: int, stride: int, dilate: bool = False) -> nn.Sequential:
        entry_dilation = self._dilation
        if dilate:  # trade the stride for dilation: same receptive field growth, 2x finer map
            self._dilation *= stride
            stride = 1
        downsample = None
        if stride != 1 or self._cin != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self._cin, planes * block.expansion, stride),
                FrozenBatchNorm2d(planes * block.expansion),
            )
        blocks = [block(self._cin, planes, stride, downsample, entry_dilation)]
        self._cin = planes * block.expansion
        blocks += [block(self._cin, planes, dilation=self._dilation) for _ in range(1, count)]
        return nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


def load_backbone_weights(backbone: ResNetFeatureMap, spec: str) -> Path:
    """Load a torchvision-format ResNet state dict into ``backbone``; returns the file used."""
    file = resolve_backbone_weights(spec)
    state = read_backbone_state(file)
    prefix = "model.backbone."  # also accept a whole ACT checkpoint and take its backbone
    if any(k.startswith(prefix) for k in state):
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    state = {
        k: v for k, v in state.items() if not k.startswith("fc.") and not k.endswith("num_batches_tracked")
    }
    result = backbone.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"{file} does not fit a {type(backbone).__name__}: missing {result.missing_keys[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
    return file
