"""LeNet-5 style convolutional network (``lenet5`` and ``simple_cnn``).

Both names build the same architecture; the papers describe it separately:

- LeNet-5, CIFAR variant, 62,006 parameters (the FedGSNR paper's CIFAR-10 model; GIFT,
  Chen et al. 2023);
- the "simple CNN" of FedDisco (Ye et al. 2023) and MOON (1 input channel for Fashion-MNIST).

Layers, for an input (C, H, W), no padding anywhere::

    Conv(C, 6, 5) -> ReLU -> MaxPool(2) -> Conv(6, 16, 5) -> ReLU -> MaxPool(2)
    -> Flatten(16 * h * w) -> FC 120 -> ReLU -> FC 84 -> ReLU -> FC num_classes

with h = ((H - 4) // 2 - 4) // 2, i.e. 5 for H = 32 (flatten 400) and 4 for H = 28
(flatten 256). Any H, W >= 16 gives h, w >= 1. Initialisation: torch defaults (no paper
specifies one).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from ._common import ZooModel
from .options import LENET_MIN_SIDE as MIN_SIDE  # noqa: F401
from .options import LeNet5Options
from .options import lenet_fits as fits  # noqa: F401
from .pool import ReLUMaxPool2x2

def _side_after_convs(side: int) -> int:
    """Spatial size after conv5 -> pool2 -> conv5 -> pool2 (floor pooling, no padding)."""
    return ((side - 4) // 2 - 4) // 2


class LeNet5(ZooModel):
    """LeNet-5 / FedDisco simple CNN.

    Parameters
    ----------
    input_shape : (C, H, W) with H, W >= 16
    num_classes : int

    Notes
    -----
    ``features`` is the 84-d output of the second FC layer after ReLU, the
    representation MOON uses (FedDisco/MOON's simple CNN; no projection head).
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        channels, height, width = input_shape
        flat = 16 * _side_after_convs(height) * _side_after_convs(width)
        # ReLU and pooling run as one layer (one compiled pass each way on CPU; see pool.py). The
        # names are the unfused stack's positions, so the parameters keep their paths (conv.0,
        # conv.3) and results files written before the fusion still load.
        self.conv = nn.Sequential(OrderedDict([
            ("0", nn.Conv2d(channels, 6, 5)), ("1", ReLUMaxPool2x2()),
            ("3", nn.Conv2d(6, 16, 5)), ("4", ReLUMaxPool2x2()),
            ("6", nn.Flatten(1)),
        ]))  # fmt: skip
        self.mlp = nn.Sequential(nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
        self.feature_dim = 84
        self.fc = nn.Linear(84, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, 84)."""
        return self.mlp(self.conv(x))


def build_lenet5(opts: LeNet5Options, input_shape: tuple[int, ...], num_classes: int) -> LeNet5:
    """Build LeNet-5 for a (C, H, W) input; the registry has checked the shape."""
    return LeNet5(input_shape, num_classes)
