"""VGG-11 and VGG-16 for CIFAR-sized images, without BatchNorm by default.

- ``vgg11``: FedNova's CIFAR-10 model (Wang et al. 2020, Sec. 6; the authors' released
  ``models/vgg.py``): config "A", no BN, classifier Dropout -> FC 512 -> ReLU -> Dropout
  -> FC 512 -> ReLU -> FC C, 9,750,922 parameters for (3, 32, 32) and 10 classes.
- ``vgg16``: the FedGSNR paper's CIFAR-100 model: config "D", no BN by default (per-sample
  gradients), Kaiming init, classifier Flatten(512) -> FC C (14,765,988 parameters for 100
  classes) or the FedMA-style 512 -> 512 -> 512 -> C head (15,291,300). The "VGG-16 with
  BN" of GIFT (Chen et al. 2023; 14,728,266 for 10 classes) is ``norm = "batch"``.

Every conv is 3x3, padding 1, followed by [norm] and ReLU; "M" is a 2x2 max-pool. Conv
weights ~ N(0, 2 / (9 * out_channels)), conv biases 0, linear layers torch-default.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ._common import ZooModel, he_conv2d, norm2d
from .options import Vgg11Options, Vgg16Options  # noqa: F401
from .options import vgg_fits as fits  # noqa: F401
from .pool import MaxPool2x2, ReLUMaxPool2x2

CFG_A = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
CFG_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
class Vgg(ZooModel):
    """VGG feature stack plus a classifier head.

    Parameters
    ----------
    cfg : tuple of int or "M"
        Conv widths and pools.
    input_shape : (C, H, W) with H, W >= 32
        The flattened conv output is 512 * (H // 32) * (W // 32); 512 for CIFAR.
    num_classes : int
    opts : Vgg11Options or Vgg16Options
    """

    def __init__(self, cfg: tuple, input_shape: tuple[int, int, int], num_classes: int, opts):
        super().__init__()
        channels, height, width = input_shape
        self.conv = _conv_stack(cfg, channels, opts.norm, opts.groups)
        pools = cfg.count("M")
        flat = cfg[-2] * (height >> pools) * (width >> pools)
        if opts.head == "mlp":
            self.mlp = nn.Sequential(
                nn.Dropout(opts.dropout), nn.Linear(flat, 512), nn.ReLU(),
                nn.Dropout(opts.dropout), nn.Linear(512, 512), nn.ReLU(),
            )  # fmt: skip
            self.feature_dim = 512
        else:
            self.mlp = nn.Identity()
            self.feature_dim = flat
        self.fc = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, feature_dim): input of the last linear layer."""
        return self.mlp(self.conv(x).flatten(1))


def _conv_stack(cfg: tuple, channels: int, norm: str, groups: int) -> nn.Sequential:
    """Conv3x3(pad 1) [-> norm] -> ReLU per width, MaxPool(2) per "M"; a ReLU followed by "M" is
    one fused layer (see pool.py). Each layer is named by its position in the unfused stack (a
    fused pair by the ReLU's), so the parameters keep their paths and older results files load."""
    layers: list[tuple[str, nn.Module]] = []
    pos = 0   # the layer's position in the unfused stack: its name
    for item in cfg:
        if item == "M":
            if layers and isinstance(layers[-1][1], nn.ReLU):
                layers[-1] = (layers[-1][0], ReLUMaxPool2x2())
            else:
                layers.append((str(pos), MaxPool2x2()))
            pos += 1
            continue
        block = [he_conv2d(channels, item, 3, padding=1)]
        if norm != "none":
            block.append(norm2d(norm, item, groups))
        block.append(nn.ReLU())
        for module in block:
            layers.append((str(pos), module))
            pos += 1
        channels = item
    return nn.Sequential(OrderedDict(layers))


def build_vgg11(opts, input_shape: tuple[int, ...], num_classes: int) -> Vgg:
    """VGG-11 (config A), as in FedNova (Wang et al. 2020)."""
    return Vgg(CFG_A, input_shape, num_classes, opts)


def build_vgg16(opts, input_shape: tuple[int, ...], num_classes: int) -> Vgg:
    """VGG-16 (config D), as in the FedGSNR paper."""
    return Vgg(CFG_D, input_shape, num_classes, opts)
