"""Every policy by name: the one place a new algorithm is registered.

Each entry maps a job-file name to a factory ``f(b) -> policy`` where ``b`` is a
:class:`Build` (the job, option objects, model dimensions); ``OPTIONS`` maps the names
that take a ``[algorithm.<name>]`` table to their option dataclass. ``PRESETS`` are the
paper names: ``[algorithm] name = "fednova"`` fills the slots not given explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import policies as pol
from .disco import DiscoOptions, DiscoWeights
from .afl import AflOptions, AflSteps
from .feddyn import DynLocal, DynOptions, DynRule
from .fedlga import LgaOptions, LgaRule
from .gift import AdaCommOptions, AdaCommSteps, GiftOptions, GiftSteps
from .gsnr import GsnrOptions, GsnrSteps
from .server import AverageRule, NovaOptions, NovaRule
from .straggler import StragglerOptions, StragglerSteps
from .variates import Scaffold, VarianceReduction


@dataclass(frozen=True)
class Build:
    """What a factory may use: the job, this policy's options, and the model's dimensions."""

    cfg: object
    options: object
    state_length: int
    num_params: int
    num_local: int
    num_clients: int
    device: torch.device
    dtype: torch.dtype


def _a(b: Build):
    return b.cfg.algorithm


# local solvers: the plain solver (sgd, momentum, prox) is always there; these add state
LOCAL = {
    "sgd": lambda b: [],
    "prox": lambda b: [],
    "scaffold": lambda b: [Scaffold(b.num_local, b.num_params, b.device, b.dtype, b.num_clients)],
    "vr": lambda b: [VarianceReduction(b.num_local, b.num_params, b.device, b.dtype, b.num_clients)],
    "dyn": lambda b: [DynLocal(b.options, b.num_local, b.num_params, b.device, b.dtype)],
}
STEPS = {
    "fixed": lambda b: pol.FixedSteps(_a(b).local_steps),
    "epochs": lambda b: pol.EpochSteps(_a(b).local_epochs, _a(b).batch_size, _a(b).epoch_rounding),
    "random_epochs": lambda b: pol.RandomEpochSteps(b.options, _a(b).batch_size, b.cfg.run.seed,
                                                    _a(b).epoch_rounding),
    "client_steps": lambda b: pol.ClientSteps(b.options, b.cfg.run.seed),
    "gsnr": lambda b: GsnrSteps(b.options, _a(b).local_steps, b.num_params, _a(b).batch_size),
    # GIFT pools its own update sum unless the delta segment is the plain weighted sum of the updates
    "gift": lambda b: GiftSteps(b.options, _a(b).local_steps, b.num_params, _a(b).server != "average"),
    "adacomm": lambda b: AdaCommSteps(b.options, _a(b).local_steps, b.cfg.system is not None and b.cfg.system.enabled),
    "afl": lambda b: AflSteps(b.options, _a(b).local_steps, b.num_params, b.cfg.run.rounds,
                              b.cfg.system is not None and b.cfg.system.enabled),
    "straggler": lambda b: StragglerSteps(
        b.options, _a(b).local_epochs if b.options.unit == "epoch" else _a(b).local_steps, _a(b).batch_size,
        b.cfg.run.seed, b.num_clients, _a(b).epoch_rounding),
}
WEIGHTS = {
    "size": lambda b: pol.SizeWeights(),
    "uniform": lambda b: pol.UniformWeights(),
    "disco": lambda b: DiscoWeights(b.options),
}
SERVER = {
    "average": lambda b: AverageRule(b.num_params, _a(b).sampling != "unbiased"),
    "nova": lambda b: NovaRule(b.options, b.num_params, _a(b).mu > 0, _a(b).sampling != "unbiased"),
    "lga": lambda b: LgaRule(b.options, b.num_params, _a(b).sampling != "unbiased"),
    "dyn": lambda b: DynRule(b.options, b.num_params, b.num_clients, _a(b).sampling != "unbiased"),
}
OPTIONS = {
    "random_epochs": pol.RandomEpochsOptions,
    "client_steps": pol.ClientStepsOptions,
    "nova": NovaOptions,
    "disco": DiscoOptions,
    "gsnr": GsnrOptions,
    "straggler": StragglerOptions,
    "gift": GiftOptions,
    "adacomm": AdaCommOptions,
    "afl": AflOptions,
    "lga": LgaOptions,
    "dyn": DynOptions,
}
PRESETS = {
    "fedavg": {"local": "sgd", "weights": "size", "server": "average"},
    "fedprox": {"local": "prox", "weights": "size", "server": "average"},
    "scaffold": {"local": "scaffold", "weights": "size", "server": "average"},
    "fednova": {"local": "sgd", "weights": "size", "server": "nova"},
    "feddisco": {"local": "sgd", "weights": "disco", "server": "average"},
    "fedgsnr": {"local": "sgd", "weights": "size", "server": "average", "steps": "gsnr"},
    "fedlga": {"local": "sgd", "weights": "uniform", "server": "lga"},
    "feddyn": {"local": "dyn", "weights": "uniform", "server": "dyn"},
    "gift": {"local": "sgd", "weights": "uniform", "server": "average", "steps": "gift"},
    "adacomm": {"local": "sgd", "weights": "uniform", "server": "average", "steps": "adacomm"},
    "afl": {"local": "sgd", "weights": "uniform", "server": "average", "steps": "afl"},
    "custom": {},
}
SLOTS = {"local": LOCAL, "steps": STEPS, "weights": WEIGHTS, "server": SERVER}
