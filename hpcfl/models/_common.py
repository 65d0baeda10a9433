"""Pieces shared by the model families: base class, shape checks, norms, inits.

Every zoo model is a :class:`ZooModel`: ``forward(x) = fc(features(x))`` where ``fc`` is
the final ``nn.Linear``. ``features`` returns the penultimate representation, which
MOON-style methods use (e.g. the 84-d penultimate feature of FedDisco's simple CNN).
"""

from __future__ import annotations

import math

import torch
from torch import nn


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


def any_shape(opts, input_shape: tuple[int, ...]) -> str | None:
    """Models that flatten their input accept every shape."""
    return None


def image_at_least(min_hw: int):
    """Shape check for (C, H, W) inputs with ``H, W >= min_hw``."""

    def check(opts, input_shape: tuple[int, ...]) -> str | None:
        if len(input_shape) != 3 or min(input_shape[1:]) < min_hw:
            return f"needs an image shape (C, H, W) with H, W >= {min_hw}"
        return None

    return check


def flat_size(input_shape: tuple[int, ...]) -> int:
    """Number of features after flattening one sample."""
    return math.prod(input_shape)


# --- normalisation -------------------------------------------------------------------

NORMS = ("none", "batch", "group")


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


def groups_problem(norm: str, groups: int, widths: tuple[int, ...]) -> list[str]:
    """Cross-field check shared by options with ``norm`` and ``groups`` fields."""
    bad = [w for w in widths if w % groups]
    if norm == "group" and bad:
        return [f"groups = {groups} must divide every layer width {sorted(set(widths))}"]
    return []


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
