"""Every policy by name: the one place a new algorithm is registered.

Each entry maps a job-file name to a factory ``f(b) -> policy`` where ``b`` is a
:class:`Build` (the job, option objects, model dimensions); ``OPTIONS`` maps the names
that take a ``[algorithm.<name>]`` table to their option dataclass. ``PRESETS`` are the
paper names: ``[algorithm] name = "fednova"`` fills the slots not given explicitly.

This module imports no torch: reading a job (``hpcfl config``, ``--help``, ``hpcfl report``)
goes through it. Policies whose code needs torch (SCAFFOLD's and FedNova-VR's control
variates, FedDyn, AFL) are imported by their factories, when a run builds them.

Defaults a policy needs to run at all (docs/algorithms/README.md, "Presets"):

- ``local = "prox"`` with ``mu`` unset takes ``PROX_MU`` = 0.01, the FedProx weight of the
  FedDisco and FedGSNR papers' comparisons (FedProx's own grid is {0.001, 0.01, 0.1, 1});
- ``steps`` = gsnr, gift, adacomm or afl with ``local_steps`` unset (0) start from the
  steps E local epochs give on average: :func:`epochs_worth`.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import numpy as np

from . import policies as pol
from .disco import DiscoOptions, DiscoWeights
from .fedlga import LgaOptions, LgaRule
from .gift import AdaCommOptions, AdaCommSteps, GiftOptions, GiftSteps
from .gsnr import GsnrOptions, GsnrSteps
from .options import AflOptions, DynOptions
from .server import AverageRule, NovaOptions, NovaRule
from .straggler import StragglerOptions, StragglerSteps

PROX_MU = 0.01
# Steps policies that start from a step count (tau0 or FedGSNR's E_const) and derive it from
# local_epochs when local_steps is unset.
STEP_COUNT_POLICIES = ("gsnr", "gift", "adacomm", "afl")


@dataclass(frozen=True)
class Build:
    """What a factory may use: the job, this policy's options, and the model's dimensions.

    ``local_steps`` is ``algorithm.local_steps``, or for the policies of
    ``STEP_COUNT_POLICIES`` with it unset, :func:`epochs_worth` of the clients.
    """

    cfg: object
    options: object
    state_length: int
    num_params: int
    num_local: int
    num_clients: int
    device: object        # torch.device
    dtype: object         # torch.dtype
    local_steps: int = 0


def epochs_worth(local_epochs: int, batch_size: int, rounding: str, sizes: np.ndarray) -> int:
    """The local steps of ``local_epochs`` epochs, averaged over the clients (at least 1).

    round(mean_i E * ceil(n_i / B)) (``rounding = "floor"``: floor(E n_i / B)): what
    ``steps = "epochs"`` gives a client on average, so a step-count policy started from it
    does the same local work per round as FedAvg on the same job.
    """
    return max(1, int(np.rint(pol.epoch_steps(local_epochs, np.asarray(sizes), batch_size, rounding).mean())))


def _a(b: Build):
    return b.cfg.algorithm


def _mod(name: str):
    """A policy module that imports torch, loaded when a run builds its policy."""
    return importlib.import_module(f"hpcfl.algorithms.{name}")


# local solvers: the plain solver (sgd, momentum, prox) is always there; these add state
LOCAL = {
    "sgd": lambda b: [],
    "prox": lambda b: [],
    "scaffold": lambda b: [_mod("variates").Scaffold(b.num_local, b.num_params, b.device, b.dtype, b.num_clients)],
    "vr": lambda b: [_mod("variates").VarianceReduction(b.num_local, b.num_params, b.device, b.dtype,
                                                        b.num_clients)],
    "dyn": lambda b: [_mod("feddyn").DynLocal(b.options, b.num_local, b.num_params, b.device, b.dtype)],
}
STEPS = {
    "fixed": lambda b: pol.FixedSteps(_a(b).local_steps),
    "epochs": lambda b: pol.EpochSteps(_a(b).local_epochs, _a(b).batch_size, _a(b).epoch_rounding),
    "random_epochs": lambda b: pol.RandomEpochSteps(b.options, _a(b).batch_size, b.cfg.run.seed,
                                                    _a(b).epoch_rounding),
    "client_steps": lambda b: pol.ClientSteps(b.options, b.cfg.run.seed),
    "gsnr": lambda b: GsnrSteps(b.options, b.local_steps, b.num_params, _a(b).batch_size),
    # GIFT pools its own update sum unless the delta segment is the plain weighted sum of the updates
    "gift": lambda b: GiftSteps(b.options, b.local_steps, b.num_params, _a(b).server != "average"),
    "adacomm": lambda b: AdaCommSteps(b.options, b.local_steps, b.cfg.system is not None and b.cfg.system.enabled),
    "afl": lambda b: _mod("afl").AflSteps(b.options, b.local_steps, b.num_params, b.cfg.run.rounds,
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
    "lga": lambda b: LgaRule(b.options, b.num_params, _a(b).sampling != "unbiased", _a(b).batch_size),
    "dyn": lambda b: _mod("feddyn").DynRule(b.options, b.num_params, b.num_clients, _a(b).sampling != "unbiased"),
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

# Legend words of each preset and policy, beside their registry entries: figures and captions
# (analysis/words.py) read them from here, so a new algorithm needs no edit outside its own lines.
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fednova": "FedNova",
          "feddisco": "FedDisco", "fedgsnr": "FedGSNR", "fedlga": "FedLGA", "feddyn": "FedDyn", "gift": "GIFT",
          "adacomm": "AdaComm", "afl": "AFL", "custom": "custom"}
SLOT_LABELS = {
    "local": {"sgd": "local SGD", "prox": "proximal local SGD", "scaffold": "SCAFFOLD variates",
              "vr": "variance reduction", "dyn": "FedDyn local"},
    "weights": {"size": "size weights", "uniform": "uniform weights", "disco": "FedDisco weights"},
    "server": {"average": "averaging", "nova": "FedNova aggregation", "lga": "FedLGA aggregation",
               "dyn": "FedDyn server"},
    "steps": {"epochs": "E epochs", "fixed": "K fixed steps", "client_steps": "steps per client",
              "gsnr": "FedGSNR steps", "straggler": "stragglers", "gift": "GIFT tau", "adacomm": "AdaComm tau",
              "afl": "AFL tau"},
}


def register(slot: str, name: str, factory, options: type | None = None, label: str | None = None) -> None:
    """Add policy ``name`` to ``slot`` (``local``, ``steps``, ``weights`` or ``server``), as one
    more line in that table would: ``factory(b: Build) -> policy``; ``options`` is the dataclass
    of its ``[algorithm.<name>]`` table; ``label`` its words in legends (default: the name).

    For a module outside hpcfl: call it at the module's top level and name the module in
    ``HPCFL_ALGORITHMS`` (docs/architecture.md, "Adding an algorithm").
    """
    if slot not in SLOTS:
        raise ValueError(f"register: slot {slot!r} is not one of {', '.join(SLOTS)}")
    if name in SLOTS[slot] or (options is not None and name in OPTIONS):
        raise ValueError(f"register: {slot} policy {name!r} is already registered; choose another name")
    SLOTS[slot][name] = factory
    if options is not None:
        OPTIONS[name] = options
    SLOT_LABELS[slot][name] = label or name


def register_preset(name: str, slots: dict[str, str], label: str | None = None) -> None:
    """Add preset ``name`` (``[algorithm] name = ...``) filling the given slots; ``label`` for legends."""
    if name in PRESETS:
        raise ValueError(f"register_preset: preset {name!r} is already registered; choose another name")
    unknown = [f"{k} = {v!r}" for k, v in slots.items() if k not in SLOTS or v not in SLOTS[k]]
    if unknown:
        raise ValueError(f"register_preset {name!r}: {', '.join(unknown)} is not a registered policy")
    PRESETS[name] = dict(slots)
    LABELS[name] = label or name


ALGORITHMS_ENV = "HPCFL_ALGORITHMS"


PLUGIN_ERRORS: list[str] = []   # why a module of $HPCFL_ALGORITHMS could not be imported (check_plugins)


def _import_plugins() -> None:
    """Import the modules named in ``$HPCFL_ALGORITHMS`` (comma-separated), which call :func:`register`.

    Here, at the end of the registry, so that every reader of the tables (the job's checks, the
    engine, the legends) sees them, on every rank alike (mpiexec passes the environment on). A
    module that cannot be imported is not raised here, at the import of hpcfl (a traceback from
    inside Python's import machinery, exit 1): :func:`check_plugins` raises it as a ConfigError when
    a job is read, one line on every rank, exit 2. Modules are looked for in ``sys.path``, then the
    current folder (:func:`hpcfl.plugins.import_module`).
    """
    from ..errors import ConfigError
    from ..plugins import import_module

    for module in filter(None, (m.strip() for m in os.environ.get(ALGORITHMS_ENV, "").split(","))):
        try:
            import_module(module, f"${ALGORITHMS_ENV} names {module!r}", (),
                          "put the folder that holds {top}.py (or the package {top}/) on PYTHONPATH, or run hpcfl "
                          "from that folder")
        except ConfigError as exc:
            PLUGIN_ERRORS.extend(p + f" (or unset {ALGORITHMS_ENV})" for p in exc.problems)


def check_plugins() -> None:
    """Raise ConfigError when a module of ``$HPCFL_ALGORITHMS`` could not be imported (every one
    that failed, each with its cause and fix)."""
    if PLUGIN_ERRORS:
        from ..errors import ConfigError

        raise ConfigError(PLUGIN_ERRORS)


_import_plugins()
