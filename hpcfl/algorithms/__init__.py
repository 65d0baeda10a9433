"""An algorithm is a combination of four policies (ARCHITECTURE section 2).

| slot          | this module's choices                    |
|---------------|------------------------------------------|
| local solver  | sgd (with momentum), prox, scaffold      |
| steps policy  | epochs, fixed                            |
| weights       | size, uniform                            |
| server rule   | average (+ server optimizer lr/momentum) |

Paper names (fedavg, fedprox, scaffold) are presets in :mod:`hpcfl.config`.

The engine sees one :class:`Algorithm` and its buffer :class:`Layout`: each client's
contribution is one row ``[delta | extras | scalars]`` that is summed over the cohort by
one exact reduction; the server reads the sums back by segment name.
"""

from __future__ import annotations

import numpy as np
import torch

from .local import LocalSolver, ScaffoldState, SolverSpec
from .policies import EpochSteps, FixedSteps, SizeWeights, UniformWeights
from .server import AverageRule, ServerOptimizer

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


class Algorithm:
    """The four policies of a job, plus the state they keep.

    Parameters
    ----------
    cfg : hpcfl.config.AlgorithmSection
    state_length : int
        L, the model's flat length (parameters and float buffers).
    num_params : int
        Trainable prefix of the flat vector.
    num_local : int
        Clients owned by this rank (for per-client state).
    """

    def __init__(self, cfg, state_length: int, num_params: int, num_local: int, device, dtype):
        self.cfg = cfg
        self.solver = LocalSolver(SolverSpec(cfg.lr, cfg.momentum, cfg.weight_decay, cfg.mu))
        self.steps = FixedSteps(cfg.local_steps) if cfg.steps == "fixed" else EpochSteps(cfg.local_epochs, cfg.batch_size)
        self.weights = UniformWeights() if cfg.weights == "uniform" else SizeWeights()
        self.rule = AverageRule()
        self.server_opt = ServerOptimizer(cfg.server_lr, cfg.server_momentum)
        self.scaffold = ScaffoldState(num_local, num_params, device, dtype) if cfg.local == "scaffold" else None
        segments = [("delta", state_length)]
        if self.scaffold is not None:
            segments.append(("dc", num_params))
        segments.append(("scalars", len(SCALARS)))
        self.layout = Layout(segments)
        self.num_params = num_params

    # ---- client side -------------------------------------------------------------
    def correction(self, slot: int) -> torch.Tensor | None:
        return self.scaffold.correction(slot) if self.scaffold is not None else None

    def contribution(self, slot: int, res, weight: float) -> np.ndarray:
        """The reduction row of one trained client (see :class:`Layout`)."""
        parts = {"delta": self.rule.contribution(res.delta.double().cpu().numpy(), weight, res.anorm)}
        if self.scaffold is not None:
            dc = self.scaffold.update(slot, res.delta[: self.num_params], res.anorm, self.cfg.lr)
            parts["dc"] = dc.double().cpu().numpy()
        parts["scalars"] = np.array(
            [weight, weight * res.steps, weight * res.anorm, weight * res.loss, 1.0, res.samples]
        )
        return self.layout.row(parts)

    # ---- server side (rank 0) ----------------------------------------------------
    def server_step(self, x: np.ndarray, sums: np.ndarray, num_clients: int) -> np.ndarray:
        """New global model from the reduced sums; updates server-side state."""
        seg = self.layout.split(sums)
        scalars = dict(zip(SCALARS, seg["scalars"]))
        agg = self.rule.aggregate(seg["delta"], scalars)
        new_x = self.server_opt.apply(x, agg)
        if self.scaffold is not None:
            # c <- c + (1/N) sum_{i in S} Delta c_i  (SCAFFOLD eq. 5, with |S|/N * mean = sum/N)
            c = self.scaffold.c.double().cpu().numpy() + seg["dc"] / num_clients
            self.scaffold.c.copy_(torch.from_numpy(c))
        return new_x

    def broadcast_extra(self) -> torch.Tensor | None:
        """Server state every rank needs next round (SCAFFOLD's c), or None."""
        return self.scaffold.c if self.scaffold is not None else None
