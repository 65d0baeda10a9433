"""FedDyn: dynamic regularisation (Acar et al., "Federated Learning Based on Dynamic
Regularization", ICLR 2021, Alg. 1). docs/algorithms/feddyn.md.

Client i, in a round with global model x^t, minimises

    F_i(theta) - <grad_i, theta> + (alpha / 2) ||theta - x^t||^2

where grad_i is its state (zero at the start), and afterwards sets
grad_i <- grad_i - alpha (theta_i - x^t). The local solver does this with its proximal
term (mu += alpha) and the correction -grad_i added to every step's gradient.

The server keeps h (zero at the start) and, over the round's participants P_t,

    h       <- h - (alpha / N) sum_{i in P_t} (theta_i - x^t)
    x^{t+1}  = x^t + sum_i p_i (theta_i - x^t) / sum_i p_i - h / alpha

(the mean of the local models minus h / alpha; p uniform in the paper, any weights
policy here, e.g. FedDisco's). The sum in h is unweighted, as in the paper, so it
travels in its own segment of the round's one reduction. Buffers (batch-norm
statistics) are averaged as in FedAvg.
"""

from __future__ import annotations

import numpy as np
import torch

from .options import DynOptions  # noqa: F401  (its home is torch-free; re-exported here)
from .protocol import Policy, RowTable, Segment, ServerArray
from .server import AverageRule


class DynLocal(Policy):
    """The client side: per-client gradient state grad_i (clients on rank, P), zero at start."""

    def __init__(self, opts: DynOptions, num_local: int, num_params: int, device: torch.device,
                 dtype: torch.dtype):
        self.alpha = opts.alpha
        self.prox = opts.alpha          # the solver adds alpha (x - x^t) to every gradient
        self.num_local, self.num_params, self.device, self.dtype = num_local, num_params, device, dtype
        self._rows = RowTable(num_local, num_params, device, dtype)   # (clients on rank [+ guests], P)

    def _table(self) -> RowTable:
        return self._rows   # table[slot]: own and guest rows alike

    def correction(self, slot: int) -> torch.Tensor:
        """-grad_i: the linear term of the local objective."""
        return -self._table()[slot]

    def pack(self, ctx, j, slot, res, weight):
        table = self._table()
        table[slot] -= self.alpha * res.delta[: self.num_params].to(table.dtype)
        return {}

    def state(self) -> list:
        return [self._rows.client_table("feddyn_grad")]


class DynRule(AverageRule):
    """The server side: the weighted mean of the updates minus h / alpha; h on rank 0."""

    tensors = False   # h is a host array: with device sums the update runs on host copies

    def __init__(self, opts: DynOptions, num_params: int, num_clients: int, normalize: bool = True):
        super().__init__(num_params, normalize)
        self.alpha, self.num_clients = opts.alpha, num_clients
        self.h = np.zeros(num_params, dtype=np.float64)

    def segments(self) -> list[Segment]:
        return [Segment("dyn_delta", self.num_params)]

    def pack(self, ctx, j, slot, res, weight):
        return {"dyn_delta": res.delta[: self.num_params]}   # widened to float64 where the row lives

    def aggregate(self, delta_sum: np.ndarray, s: dict, seg: dict | None = None) -> np.ndarray:
        self.h = self.h - (self.alpha / self.num_clients) * seg["dyn_delta"]
        agg = super().aggregate(delta_sum, s)
        agg[: self.num_params] -= self.h / self.alpha
        return agg

    def state(self) -> list:
        def set_h(value):
            self.h = np.array(value, dtype=np.float64, copy=True)

        return [ServerArray("feddyn_h", lambda: self.h, set_h)]
