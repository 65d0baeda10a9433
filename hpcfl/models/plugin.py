"""A model of your own (``model.name = "nets:SmallCNN"``): built, and checked at start-up.

The contract (:mod:`hpcfl.plugins` finds the callable and its options)::

    SmallCNN(input_shape: tuple[int, ...], num_classes: int, **options) -> torch.nn.Module

mapping a float batch (B, *input_shape) to logits (B, num_classes), trained with cross-entropy.
It is built on every rank right after ``torch.manual_seed(...)``, as the built-in models are, so
its initialisation must draw from torch's global RNG only.

:func:`build_plugin` checks the rules the engine relies on, each broken one a ConfigError naming the
model, the rule and the fix: the call returns an ``nn.Module``; it has at least one trainable
parameter; every parameter is floating point; no buffer is an integer or bool (the engine
moves a model as one float vector: an integer buffer such as BatchNorm's ``num_batches_tracked``
would not travel with it); two builds from the same torch RNG state are bitwise equal (every
parameter and buffer); a forward pass of a batch of two zero inputs (float32, CPU, no grad)
gives a floating-point (2, num_classes).

The check builds the model twice. The first build comes from the caller's RNG state and is the
one returned; the second comes from the same state and is thrown away after the forward pass;
then torch's RNG is left as the first build left it. The engine's model, and every draw after it,
are therefore bitwise what they would be without the check.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..plugins import Plugin, raised_at

RULE_MODULE = "the call returns a torch.nn.Module"
RULE_PARAMS = "the model has at least one trainable parameter"
RULE_FLOAT = "every parameter is floating point"
RULE_BUFFERS = "no buffer is an integer or bool tensor (the engine moves a model as one float vector)"
RULE_SEED = "built twice from the same torch seed, the model is bitwise the same"
RULE_FORWARD = "a batch (2, *input_shape) of float32 zeros on the CPU gives floating-point logits (2, num_classes)"


def build_plugin(plugin: Plugin, options, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """Build the plug-in model from torch's current RNG state and check it (see the module docstring).

    Parameters
    ----------
    plugin : hpcfl.plugins.Plugin
    options : instance of ``plugin.options``
    input_shape : tuple of int
        One sample's shape, without the batch dim.
    num_classes : int

    Returns
    -------
    torch.nn.Module
        The first build, exactly as the callable made it.
    """
    shape = tuple(int(s) for s in input_shape)
    cpu0, cuda0 = _rng_state()
    model = _construct(plugin, options, shape, num_classes)
    after = _rng_state()
    _check_module(plugin, model)
    try:
        _set_rng_state(cpu0, cuda0)
        again = _construct(plugin, options, shape, num_classes)
        _check_same(plugin, model, again)
        _check_forward(plugin, again, shape, num_classes)
    finally:
        _set_rng_state(*after)
    return model


def _rng_state():
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(cpu, cuda) -> None:
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _refuse(plugin: Plugin, found: str, rule: str, fix: str) -> ConfigError:
    return ConfigError(f"{plugin.label}: {found}; the rule: {rule}; fix: {fix}")


def _construct(plugin: Plugin, options, shape, num_classes):
    try:
        return plugin.call(options, shape, num_classes)
    except Exception as exc:   # the user's code: its line, not a traceback
        raise ConfigError(f"{plugin.label}: building it for input_shape {shape} and num_classes {num_classes} "
                          f"raised {raised_at(exc)}; fix the model") from None


def _check_module(plugin: Plugin, model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise _refuse(plugin, f"the call returned a {type(model).__name__}, not a torch.nn.Module", RULE_MODULE,
                      "return the module itself (e.g. torch.nn.Sequential(...), or a subclass of torch.nn.Module)")
    params = list(model.named_parameters())
    if not any(p.requires_grad for _, p in params):
        raise _refuse(plugin, "the model has no trainable parameter", RULE_PARAMS,
                      "register its weights as torch.nn.Parameter (layers such as torch.nn.Linear do), with "
                      "requires_grad = True")
    for name, p in params:
        if not p.is_floating_point():
            raise _refuse(plugin, f"parameter {name!r} is {p.dtype}", RULE_FLOAT,
                          f"make {name!r} a float tensor, or a buffer if it is not trained")
    for name, b in model.named_buffers():
        if not b.is_floating_point():
            fix = ("build BatchNorm with track_running_stats=False, use GroupNorm, or delete the buffer "
                   "(del module.num_batches_tracked)" if name.endswith("num_batches_tracked") else
                   f"store {name!r} as a float tensor, or as a plain attribute if it is a constant")
            raise _refuse(plugin, f"buffer {name!r} is {b.dtype}", RULE_BUFFERS, fix)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _check_same(plugin: Plugin, first: torch.nn.Module, second) -> None:
    fix = ("draw the initial weights from torch's global RNG only (torch.nn.init, torch.randn without a "
           "generator), not from numpy's or Python's global RNG or a generator of your own")
    a = dict(first.named_parameters()) | {f"buffer {n}": b for n, b in first.named_buffers()}
    b = dict(second.named_parameters()) | {f"buffer {n}": t for n, t in second.named_buffers()} \
        if isinstance(second, torch.nn.Module) else {}
    if list(a) != list(b) or any(a[k].shape != b[k].shape or a[k].dtype != b[k].dtype for k in a):
        raise _refuse(plugin, "built twice with the same arguments, it made different parameters", RULE_SEED,
                      "build the same layers on every call")
    for name in a:
        if not torch.equal(_bits(a[name]), _bits(b[name])):
            raise _refuse(plugin, f"built twice from the same torch seed, its {name!r} differs", RULE_SEED, fix)


def _check_forward(plugin: Plugin, model: torch.nn.Module, shape, num_classes: int) -> None:
    batch = (2, *shape)
    x = torch.zeros(batch, dtype=torch.float32)
    try:
        with torch.no_grad():
            out = model.float()(x)
    except Exception as exc:
        raise _refuse(plugin, f"a forward pass of zeros of shape {batch} raised {raised_at(exc)}", RULE_FORWARD,
                      f"make its layers fit input_shape {shape} (one sample's shape, without the batch dim)") from None
    if not isinstance(out, torch.Tensor):
        raise _refuse(plugin, f"its forward pass returned a {type(out).__name__}, not a tensor", RULE_FORWARD,
                      "return the logits tensor alone")
    if tuple(out.shape) != (2, num_classes) or not out.is_floating_point():
        raise _refuse(plugin, f"its forward pass of zeros of shape {batch} returned {out.dtype} of shape "
                              f"{tuple(out.shape)}, expected (2, {num_classes})", RULE_FORWARD,
                      f"end with a layer of num_classes = {num_classes} outputs and no reshaping of the batch dim")
