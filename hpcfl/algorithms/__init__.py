"""An algorithm is a combination of four policies (ARCHITECTURE section 2).

| slot          | choices                                                         |
|---------------|-----------------------------------------------------------------|
| local solver  | sgd (momentum, in-round lr decay), prox, scaffold, vr           |
| steps policy  | epochs, fixed, random_epochs, client_steps                      |
| weights       | size, uniform                                                   |
| server rule   | average, nova (+ server optimizer: lr, momentum)                |

Paper names (fedavg, fedprox, scaffold, fednova) are presets in :mod:`hpcfl.config`.

The engine sees one :class:`Algorithm` and its buffer :class:`Layout`: each client's
contribution is one row ``[delta | extras | scalars]`` summed over the cohort by one
exact reduction; the server reads the sums back by segment name.
"""

from __future__ import annotations

import numpy as np
import torch

from .local import LocalSolver, ScaffoldState, SolverSpec, VRState
from .policies import ClientSteps, EpochSteps, FixedSteps, RandomEpochSteps, SizeWeights, UniformWeights
from .server import AverageRule, NovaRule, ServerOptimizer

SCALARS = ("weight", "weight_steps", "weight_anorm", "weight_loss", "count", "samples")


class Layout:
    """Named contiguous segments of the reduction buffer.

    Parameters
    ----------
    segments : list of (name, length)
    """

    def __init__(self, segments: list[tuple[str, int]]):
        self.slices: dict[str, slice] = {}
        offset = 0
        for name, n in segments:
            self.slices[name] = slice(offset, offset + n)
            offset += n
        self.length = offset

    def row(self, parts: dict[str, np.ndarray]) -> np.ndarray:
        """One contribution row from its segments (missing segments are zero)."""
        row = np.zeros(self.length, dtype=np.float64)
        for name, value in parts.items():
            row[self.slices[name]] = value
        return row

    def split(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        return {name: buf[s] for name, s in self.slices.items()}


def round_lr(cfg, rnd: int, rounds: int) -> float:
    """The client lr of round ``rnd``: constant, or multiplied by lr_gamma at each milestone.

    Milestones are fractions of the run: (0.5, 0.75) with gamma 0.1 is FedNova's
    [CODE] schedule (x0.1 from round floor(R/2), x0.01 from floor(0.75 R); fednova.md A3).
    """
    if cfg.lr_schedule == "constant":
        return cfg.lr
    passed = sum(rnd >= int(m * rounds) for m in cfg.lr_milestones)
    return cfg.lr * cfg.lr_gamma**passed


class Algorithm:
    """The four policies of a job, plus the state they keep.

    Parameters
    ----------
    cfg : hpcfl.config.Config
    state_length : int
        L, the model's flat length (parameters and float buffers).
    num_params : int
        Trainable prefix of the flat vector.
    num_local : int
        Clients owned by this rank (for per-client state).
    """

    def __init__(self, cfg, state_length: int, num_params: int, num_local: int, device, dtype):
        a = cfg.algorithm
        self.cfg, self.num_params = a, num_params
        self.solver = LocalSolver(SolverSpec(a.lr, a.momentum, a.weight_decay, a.mu, a.local_lr_decay))
        self.steps = {
            "fixed": lambda: FixedSteps(a.local_steps),
            "epochs": lambda: EpochSteps(a.local_epochs, a.batch_size, a.epoch_rounding),
            "random_epochs": lambda: RandomEpochSteps(cfg.steps_options, a.batch_size, cfg.run.seed, a.epoch_rounding),
            "client_steps": lambda: ClientSteps(cfg.steps_options, cfg.run.seed),
        }[a.steps]()
        self.weights = UniformWeights() if a.weights == "uniform" else SizeWeights()
        normalize = a.sampling != "unbiased"
        if a.server == "nova":
            self.rule = NovaRule(cfg.server_options, num_params, a.local == "prox", normalize)
        else:
            self.rule = AverageRule(num_params, normalize)
        self.server_opt = ServerOptimizer(a.server_lr, a.server_momentum, lr_scaled=a.server == "nova")
        self.state = None
        if a.local == "scaffold":
            self.state = ScaffoldState(num_local, num_params, device, dtype)
        elif a.local == "vr":
            self.state = VRState(num_local, num_params, device, dtype)
        segments = [("delta", state_length)]
        if self.state is not None:
            segments.append(("extra", num_params))
        segments.append(("scalars", len(SCALARS)))
        self.layout = Layout(segments)
        self.lr = a.lr

    def begin_round(self, rnd: int, rounds: int) -> float:
        """Set and return the round's client lr."""
        self.lr = round_lr(self.cfg, rnd, rounds)
        return self.lr

    # ---- client side -------------------------------------------------------------
    def correction(self, slot: int) -> torch.Tensor | None:
        return self.state.correction(slot) if self.state is not None else None

    def contribution(self, slot: int, res, weight: float) -> np.ndarray:
        """The reduction row of one trained client (see :class:`Layout`)."""
        parts = {"delta": self.rule.contribution(res.delta.double().cpu().numpy(), weight, res.anorm)}
        if isinstance(self.state, ScaffoldState):   # unweighted Delta c_i (SCAFFOLD eq. 5)
            dc = self.state.update(slot, res.delta[: self.num_params], res.anorm, self.lr)
            parts["extra"] = dc.double().cpu().numpy()
        elif isinstance(self.state, VRState):        # p_i h_i for hbar = sum p h / sum p
            h = self.state.update(slot, res.delta[: self.num_params], res.anorm, self.lr)
            parts["extra"] = h.double().cpu().numpy() * weight
        parts["scalars"] = np.array(
            [weight, weight * res.steps, weight * res.anorm, weight * res.loss, 1.0, res.samples]
        )
        return self.layout.row(parts)

    # ---- server side (rank 0) ----------------------------------------------------
    def server_step(self, x: np.ndarray, sums: np.ndarray, num_clients: int) -> tuple[np.ndarray, dict]:
        """New global model from the reduced sums, and round diagnostics (tau_eff)."""
        seg = self.layout.split(sums)
        s = dict(zip(SCALARS, seg["scalars"]))
        if s["weight"] == 0:           # nobody reported (all dropped): keep the model
            return x, {"tau_eff": float("nan")}
        agg = self.rule.aggregate(seg["delta"], s)
        new_x = self.server_opt.apply(x, agg, self.lr)
        if isinstance(self.state, ScaffoldState):
            # c <- c + (1/N) sum_{i in S} Delta c_i  (|S|/N times the cohort mean)
            c = self.state.c.double().cpu().numpy() + seg["extra"] / num_clients
            self.state.c.copy_(torch.from_numpy(c))
        elif isinstance(self.state, VRState):
            self.state.c.copy_(torch.from_numpy(seg["extra"] / s["weight"]))
        return new_x, {"tau_eff": self.rule.tau_eff(s)}

    def broadcast_extra(self) -> torch.Tensor | None:
        """Server state every rank needs next round (SCAFFOLD's c, VR's hbar), or None."""
        return self.state.c if self.state is not None else None
