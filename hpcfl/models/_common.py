"""Pieces shared by the model families: base class, shape checks, norms, inits.

Every zoo model is a :class:`ZooModel`: ``forward(x) = fc(features(x))`` where ``fc`` is
the final ``nn.Linear``. ``features`` returns the penultimate representation, which
MOON-style methods use (e.g. the 84-d penultimate feature of FedDisco's simple CNN).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .options import NORMS, any_shape, groups_problem, image_at_least  # noqa: F401  (re-exported)


class ZooModel(nn.Module):
    """Base class: a feature extractor followed by one linear layer ``self.fc``.

    Subclasses implement :meth:`features` and set ``self.fc`` and ``self.feature_dim``.
    """

    feature_dim: int

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate representation.

        Parameters
        ----------
        x : Tensor, shape (B, *input_shape)

        Returns
        -------
        Tensor, shape (B, feature_dim)
        """
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, shape (B, num_classes), for ``x`` of shape (B, *input_shape)."""
        return self.fc(self.features(x))


# --- input-shape checks --------------------------------------------------------------
# A check takes (options, input_shape) and returns None when the shape fits, else a short
# reason that completes the sentence "this model ...". The registry turns the reason into
# a ConfigError; it lists the models that fit by calling each check with default options.


def flat_size(input_shape: tuple[int, ...]) -> int:
    """Number of features after flattening one sample."""
    return math.prod(input_shape)


# --- normalisation -------------------------------------------------------------------



def norm2d(kind: str, channels: int, groups: int) -> nn.Module:
    """Normalisation layer for ``channels`` feature maps.

    Parameters
    ----------
    kind : {"none", "batch", "group"}
    channels : int
    groups : int
        GroupNorm groups; must divide ``channels`` (checked by the options' ``validate``).

    Returns
    -------
    nn.Module
        ``nn.Identity`` for "none". For "batch", a BatchNorm2d whose only buffers are the
        float running mean and variance: the integer ``num_batches_tracked`` counter is
        dropped because the engine averages every buffer across clients, and the counter
        is unused when ``momentum`` is set (it is, 0.1).
    """
    if kind == "batch":
        bn = nn.BatchNorm2d(channels)
        bn.num_batches_tracked = None  # BN's forward skips the counter when it is None
        return bn
    if kind == "group":
        return nn.GroupNorm(groups, channels)
    return nn.Identity()


# --- initialisation ------------------------------------------------------------------
# All draws use torch's global RNG, so the caller's torch.manual_seed fixes them.


def normal_fan_in_(linear: nn.Linear, gain: float) -> None:
    """W ~ N(0, gain / fan_in), b = 0. ``gain`` 2 is He-normal, 1 is LeCun-normal."""
    fan_in = linear.weight.shape[1]
    nn.init.normal_(linear.weight, 0.0, math.sqrt(gain / fan_in))
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


def he_conv2d(
    cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0, bias: bool = True
) -> nn.Conv2d:
    """Conv2d initialised only by :func:`conv_he_fan_out_`.

    ``skip_init`` avoids torch's default Kaiming-uniform draw, which would be overwritten
    anyway; for VGG-16 that halves the build time.
    """
    conv = nn.utils.skip_init(
        nn.Conv2d, cin, cout, kernel, stride=stride, padding=padding, bias=bias
    )
    conv_he_fan_out_(conv)
    return conv


def conv_he_fan_out_(conv: nn.Conv2d) -> None:
    """W ~ N(0, 2 / (k*k*out_channels)), b = 0 (He et al. 2015, fan-out mode).

    This is the VGG init of FedNova's released code and torchvision's ResNet init.
    """
    k_h, k_w = conv.kernel_size
    nn.init.normal_(conv.weight, 0.0, math.sqrt(2.0 / (k_h * k_w * conv.out_channels)))
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)
