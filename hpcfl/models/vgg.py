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
from dataclasses import dataclass, field

import torch
from torch import nn

from ._common import NORMS, ZooModel, groups_problem, he_conv2d, image_at_least, norm2d
from .pool import MaxPool2x2, ReLUMaxPool2x2

CFG_A = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
CFG_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
WIDTHS = (64, 128, 256, 512)

#: Five 2x2 pools: the input must be at least 32 on each side to keep a 1x1 map.
fits = image_at_least(32)


@dataclass(frozen=True)
class Vgg11Options:
    """Options of ``vgg11`` (FedNova's VGG-11, Wang et al. 2020).

    head : "mlp" is Dropout -> FC 512 -> ReLU -> Dropout -> FC 512 -> ReLU -> FC C (FedMA /
        FedNova code); "linear" is a single FC C on the flattened conv output.
    dropout : drop probability of the two Dropout layers of the "mlp" head (unused by
        "linear"). Dropout draws random masks in train mode: per-sample gradients with
        torch.func.vmap need ``randomness="different"`` or dropout = 0.
    norm : "none" (default, per-sample-gradient safe), "batch" (adds float running-stat
        buffers) or "group" (GroupNorm with ``groups`` groups) after every conv.
    groups : GroupNorm groups; must divide 64.
    """

    head: str = field(default="mlp", metadata={
        "choices": ("mlp", "linear"),
        "help": "classifier: mlp = Dropout, FC 512, ReLU, Dropout, FC 512, ReLU, FC C (FedNova); linear = one FC"})
    dropout: float = field(default=0.5, metadata={
        "ge": 0.0, "lt": 1.0, "help": "drop probability of the mlp head's two Dropout layers (unused by linear)"})
    norm: str = field(default="none", metadata={
        "choices": NORMS, "help": "after every conv: none, batch (adds running-stat buffers) or group (GroupNorm)"})
    groups: int = field(default=32, metadata={"gt": 0, "help": "GroupNorm groups for norm = 'group'; must divide 64"})

    def validate(self) -> list[str]:
        return groups_problem(self.norm, self.groups, WIDTHS)


@dataclass(frozen=True)
class Vgg16Options(Vgg11Options):
    """Options of ``vgg16`` (the FedGSNR paper's VGG-16); as ``vgg11`` but the default head is "linear".

    GIFT's VGG-16 (Chen et al. 2023) is ``norm = "batch"`` with the default head.
    """

    head: str = field(default="linear", metadata={
        "choices": ("mlp", "linear"),
        "help": "classifier: linear = one FC (the default here); mlp = FedNova's FC 512-512 head"})


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
