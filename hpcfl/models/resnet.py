"""ResNet-18 with GroupNorm (default), BatchNorm or no normalisation.

FedDisco (Ye et al. 2023; "ResNet-18 with GroupNorm", HAM10000 and CIFAR-100): torchvision's
resnet18 with the first conv replaced by 3x3 / stride 1 / padding 1, the first max-pool
removed, every BatchNorm replaced by GroupNorm with **2 groups**, final FC -> C.
FedLGA's CIFAR ResNet (Li et al.; inputs resized to 224) uses the torchvision ImageNet
stem: ``stem = "imagenet"``.

Layout (BasicBlock, expansion 1)::

    stem -> [64] x2 -> [128, stride 2] x2 -> [256, stride 2] x2 -> [512, stride 2] x2
    -> global average pool -> FC(512, C)

A block is conv3x3 -> norm -> ReLU -> conv3x3 -> norm, plus the shortcut (identity, or
conv1x1 with stride -> norm when the shape changes), then ReLU. Init as torchvision:
convs ~ N(0, 2 / (k*k*out_channels)), norm weight 1 and bias 0, FC torch-default.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import ZooModel, he_conv2d, norm2d
from .options import RESNET_MIN_SIDE as MIN_SIDE  # noqa: F401
from .options import RESNET_WIDTHS as WIDTHS
from .options import ResNet18Options
from .options import resnet_fits as fits  # noqa: F401

BLOCKS = (2, 2, 2, 2)
def _conv(cin: int, cout: int, kernel: int, stride: int, norm: str) -> nn.Conv2d:
    # A bias right before a norm is redundant (the norm's shift absorbs it), hence
    # torchvision's bias=False; without a norm the bias is the only shift, so keep it.
    return he_conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=norm == "none")


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection.

    Parameters
    ----------
    cin, cout : int
        Input and output channels.
    stride : int
        Stride of the first conv and of the projection shortcut.
    norm : {"none", "batch", "group"}
    groups : int
    """

    def __init__(self, cin: int, cout: int, stride: int, norm: str, groups: int):
        super().__init__()
        self.conv1 = _conv(cin, cout, 3, stride, norm)
        self.norm1 = norm2d(norm, cout, groups)
        self.conv2 = _conv(cout, cout, 3, 1, norm)
        self.norm2 = norm2d(norm, cout, groups)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            projection = _conv(cin, cout, 1, stride, norm)
            self.shortcut = nn.Sequential(projection, norm2d(norm, cout, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, cin, H, W) -> (B, cout, ceil(H / stride), ceil(W / stride))."""
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))

    def zero_init_branch(self) -> None:
        """Make the residual branch output exactly 0 at init."""
        last = self.norm2 if isinstance(self.norm2, (nn.BatchNorm2d, nn.GroupNorm)) else self.conv2
        nn.init.zeros_(last.weight)


class ResNet18(ZooModel):
    """ResNet-18 for (C, H, W) images.

    Parameters
    ----------
    input_shape : (C, H, W)
        H, W >= 8 (CIFAR stem) or >= 32 (ImageNet stem).
    num_classes : int
    opts : ResNet18Options
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, opts: ResNet18Options):
        super().__init__()
        norm, groups = opts.norm, opts.groups
        if opts.stem == "cifar":
            stem = [_conv(input_shape[0], 64, 3, 1, norm), norm2d(norm, 64, groups), nn.ReLU()]
        else:
            stem = [_conv(input_shape[0], 64, 7, 2, norm), norm2d(norm, 64, groups), nn.ReLU()]
            stem.append(nn.MaxPool2d(3, stride=2, padding=1))
        self.stem = nn.Sequential(*stem)
        stages, cin = [], 64
        for i, (width, blocks) in enumerate(zip(WIDTHS, BLOCKS)):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(cin, width, stride, norm, groups)]
            stage += [BasicBlock(width, width, 1, norm, groups) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            cin = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
        self.feature_dim = WIDTHS[-1]
        self.fc = nn.Linear(WIDTHS[-1], num_classes)
        if opts.zero_init_residual:
            for block in self.modules():
                if isinstance(block, BasicBlock):
                    block.zero_init_branch()

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, 512): globally pooled output of the last stage."""
        return self.pool(self.stages(self.stem(x)))


def build_resnet18(
    opts: ResNet18Options, input_shape: tuple[int, ...], num_classes: int
) -> ResNet18:
    """Build ResNet-18 for a (C, H, W) input; the registry has checked the shape."""
    return ResNet18(input_shape, num_classes, opts)
