"""Model zoo: the registry the engine builds models from.

>>> opts = options.build(model_options("vgg11"), {"dropout": 0.0}, "model")
>>> torch.manual_seed(0)
>>> net = build_model("vgg11", opts, (3, 32, 32), 10)   # logits (B, 10)

Conventions shared by every model:

- Input (B, *input_shape), output logits (B, num_classes). Fully connected models flatten
  any shape; convolutional models need (C, H, W) and say which sizes fit.
- ``model.features(x)`` returns the penultimate representation (B, model.feature_dim);
  ``forward = model.fc(model.features(x))``.
- Initialisation draws only from torch's global RNG, so ``torch.manual_seed`` right
  before :func:`build_model` fixes every parameter.
- No BatchNorm unless ``norm = "batch"`` is chosen; then the only buffers are the float
  running mean and variance (no integer ``num_batches_tracked``).
"""

from __future__ import annotations

import importlib
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .. import plugins
from ..errors import ConfigError, nearest
from . import options as o
from .options import any_shape

if TYPE_CHECKING:
    import torch

# The registry imports no torch: reading a job needs only the options (hpcfl/models/options.py).
# A model's module, which does, is imported when the model is built.


@dataclass(frozen=True)
class ModelSpec:
    """One registered model.

    Attributes
    ----------
    options : type
        Frozen options dataclass; every field has a default.
    build : callable (options, input_shape, num_classes) -> nn.Module
        Checks the input shape (ConfigError naming ``model.name``), imports the model's
        module and builds.
    doc : str
        One line, citing the paper the architecture comes from.
    fits : callable (options, input_shape) -> str or None
        None when the input shape fits, else the reason (used for error messages).
    """

    options: type
    build: Callable[..., torch.nn.Module]
    doc: str
    fits: Callable[..., str | None] = any_shape


def _register(name: str, options: type, builder: str, doc: str, fits=any_shape) -> ModelSpec:
    """Wrap ``builder`` ("module:function" in this package) so that a misfit shape raises
    ConfigError before its module (and torch) is even imported."""

    def build(opts, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
        input_shape = _check_args(name, options, opts, input_shape, num_classes)
        reason = fits(opts, input_shape)
        if reason:
            fitting = ", ".join(models_fitting(input_shape)) or "(none)"
            raise ConfigError(
                f"model.name = {name!r} does not fit input shape {input_shape}: it {reason}. "
                f"Models that fit {input_shape}: {fitting}"
            )
        module, function = builder.split(":")
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)(opts, input_shape, num_classes)

    return ModelSpec(options=options, build=build, doc=doc, fits=fits)


def _check_args(name, options, opts, input_shape, num_classes) -> tuple[int, ...]:
    """Programming errors in the engine's call, not user config: raise TypeError/ValueError."""
    if type(opts) is not options:  # exact: Vgg16Options subclasses Vgg11Options
        raise TypeError(f"{name} needs {options.__name__} options, got {type(opts).__name__}")
    try:  # operator.index accepts numpy integers but never rounds a float
        shape = tuple(operator.index(s) for s in input_shape)
    except TypeError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be positive ints, no batch dim; got {input_shape}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    return shape


_LENET_DOC = "Conv6-Conv16 (5x5) + FC 120-84; 62,006 params on CIFAR-10"

MODELS: dict[str, ModelSpec] = {
    "logreg": _register(
        "logreg", o.LogRegOptions, "simple:build_logreg",
        "Multinomial logistic regression on the flattened input (Synthetic(1,1) model of Wang et al. 2020, FedNova).",
    ),
    "mlp": _register(
        "mlp", o.MlpOptions, "simple:build_mlp",
        "MLP on the flattened input; torch, He-normal (He et al. 2015) or He/LeCun-normal init.",
    ),
    "fedlga_mlp": _register(
        "fedlga_mlp", o.FedlgaMlpOptions, "simple:build_mlp",
        "FMNIST MLP 784-400-10 with ReLU of Li et al. (FedLGA); mlp with hidden=[400].",
    ),
    "lenet5": _register(
        "lenet5", o.LeNet5Options, "cnn:build_lenet5",
        f"LeNet-5, {_LENET_DOC} (FedGSNR paper; Chen et al. 2023, GIFT).", o.lenet_fits,
    ),
    "simple_cnn": _register(
        "simple_cnn", o.LeNet5Options, "cnn:build_lenet5",
        f"FedDisco/MOON simple CNN = LeNet-5 layout, {_LENET_DOC} (Ye et al. 2023).", o.lenet_fits,
    ),
    "vgg11": _register(
        "vgg11", o.Vgg11Options, "vgg:build_vgg11",
        "VGG-11 config A without BN, FC 512-512 head; 9,750,922 params (Wang et al. 2020, FedNova).",
        o.vgg_fits,
    ),
    "vgg16": _register(
        "vgg16", o.Vgg16Options, "vgg:build_vgg16",
        "VGG-16 config D without BN by default, FC head (FedGSNR paper; with BN: Chen et al. 2023, GIFT).",
        o.vgg_fits,
    ),
    "resnet18": _register(
        "resnet18", o.ResNet18Options, "resnet:build_resnet18",
        "CIFAR ResNet-18 with GroupNorm(2) by default (Ye et al. 2023, FedDisco; ImageNet stem: Li et al., FedLGA).",
        o.resnet_fits,
    ),
    "kws_lstm": _register(
        "kws_lstm", o.KwsLstmOptions, "rnn:build_kws_lstm",
        "2-layer LSTM(64) + FC for keyword spotting; 61,066 params on 40 features (Chen et al. 2023, GIFT).",
        o.lstm_fits,
    ),
    "char_lstm": _register(
        "char_lstm", o.CharLstmOptions, "rnn:build_char_lstm",
        "8-dim character embedding + 2-layer LSTM(256) + FC, next character; 819,920 params over LEAF's 80 "
        "characters (Caldas et al. 2018, LEAF Shakespeare).",
        o.char_fits,
    ),
    "quadratic": _register(
        "quadratic", o.QuadraticModelOptions, "quadratic:build_quadratic",
        "quadratic objectives of FedNova (Wang et al. 2020) and GIFT (Chen et al. 2023); use with data.dataset = quadratic.",
        o.fits_quadratic,
    ),
}  # fmt: skip


def models_fitting(input_shape: tuple[int, ...]) -> list[str]:
    """Names of the models whose default options accept ``input_shape``."""
    shape = tuple(input_shape)
    return [n for n, spec in MODELS.items() if spec.fits(spec.options(), shape) is None]


PLUGIN_HINT = 'a model of your own: model.name = "yourmodule:YourModel"'


def model_options(name: str, search=()) -> type:
    """Options dataclass of model ``name``: a built-in's, or a plug-in's (``"module:Attribute"``,
    :mod:`hpcfl.plugins`; ``search``: folders to look for its module in, the job file's).

    Raises
    ------
    ConfigError
        Unknown name (the message names ``model.name``, lists the valid names and says how to
        name your own), or a plug-in that cannot be imported.
    """
    if plugins.is_plugin(name):
        return plugins.resolve("model", name, search).options
    if name not in MODELS:
        valid = ", ".join(MODELS)
        guess = nearest(name, MODELS) if isinstance(name, str) else None
        raise ConfigError(f"model.name = {name!r} is not a known model; " + (
            f"did you mean {guess!r}? (or one of {valid})" if guess else f"choose one of {valid}") +
            f"; {PLUGIN_HINT}")
    return MODELS[name].options


def build_model(
    name: str, options, input_shape: tuple[int, ...], num_classes: int
) -> torch.nn.Module:
    """Build model ``name``; seed torch's global RNG first for a reproducible init.

    Parameters
    ----------
    name : str
        A key of :data:`MODELS`, or a plug-in's ``"module:Attribute"`` (built and checked by
        :func:`hpcfl.models.plugin.build_plugin`).
    options : instance of ``model_options(name)``
    input_shape : tuple of int
        One sample's shape without the batch dim, e.g. (3, 32, 32), (60,), (1, 8, 8).
    num_classes : int

    Returns
    -------
    torch.nn.Module
        Maps (B, *input_shape) to logits (B, num_classes).

    Raises
    ------
    ConfigError
        Unknown name, a model that does not fit ``input_shape``, or a plug-in that breaks a rule
        of :mod:`hpcfl.models.plugin`.
    """
    if plugins.is_plugin(name):
        from .plugin import build_plugin

        plugin = plugins.of(options)
        if plugin is None or plugin.name != name:
            raise TypeError(f"{name} needs the options model_options({name!r}) made, got {type(options).__name__}")
        return build_plugin(plugin, options, input_shape, num_classes)
    model_options(name)
    return MODELS[name].build(options, input_shape, num_classes)


__all__ = ["MODELS", "ModelSpec", "build_model", "model_options", "models_fitting"]
