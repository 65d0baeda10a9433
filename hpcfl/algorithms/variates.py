"""Control variates: SCAFFOLD (option II) and FedNova's cross-client variance reduction.

Both correct every local gradient by ``c - c_i`` and keep per-client rows ``c_i`` on the
owning rank and a server vector ``c`` that every rank needs, so both are policies on the
state protocol (:mod:`hpcfl.algorithms.protocol`): a :class:`ClientTable`, a broadcast
:class:`ServerArray`, one reduction segment, and one vector more each way on the wire.
"""

from __future__ import annotations

import numpy as np
import torch

from .protocol import Policy, RowTable, Segment, ServerArray


class _Variates(Policy):
    """Per-client rows (clients on rank, num_params) and a server vector c (num_params,)."""

    segment = "extra"

    def __init__(self, num_local: int, num_params: int, device: torch.device, dtype: torch.dtype,
                 num_clients: int = 0):
        self.num_local, self.num_params, self.num_clients = num_local, num_params, num_clients
        self.device, self.dtype = device, dtype
        self._rows = RowTable(num_local, num_params, device, dtype)   # (clients on rank [+ guests], P)
        self.c = torch.zeros(num_params, device=device, dtype=dtype)

    def _table(self) -> RowTable:
        return self._rows   # table[slot]: own and guest rows alike

    def correction(self, slot: int) -> torch.Tensor:
        """c - c_i, added to every local gradient of the client in ``slot``."""
        return self.c - self._table()[slot]

    def segments(self) -> list[Segment]:
        return [Segment(self.segment, self.num_params)]

    def state(self) -> list:
        def set_c(value):
            self.c.copy_(torch.from_numpy(value))

        return [self._rows.client_table(self.table_name),
                ServerArray(self.server_name, lambda: self.c.detach().cpu().numpy(), set_c, broadcast=True)]

    def transfer(self) -> tuple[int, int]:
        return self.upload, self.num_params


class Scaffold(_Variates):
    """SCAFFOLD control variates, option II (Karimireddy et al. 2020, Alg. 1).

    The client sends Delta c_i unweighted (eq. 5); the server sets
    c <- c + (1/N) sum_{i in S} Delta c_i, whatever the aggregation weights are.
    """

    table_name, server_name = "scaffold_c_i", "scaffold_c"

    @property
    def upload(self) -> int:
        return self.num_params   # Delta c_i goes up with the model delta

    def update(self, slot: int, delta: torch.Tensor, anorm: float, lr: float) -> torch.Tensor:
        """Option II: c_i+ = c_i - c + (x0 - y_i) / (||a||_1 lr); returns Delta c_i = c_i+ - c_i.

        ``delta`` is y_i - x0 over the parameters. With plain SGD ||a||_1 = K (the number
        of local steps), which is the paper's formula; ||a||_1 generalises it to momentum
        and proximal solvers.
        """
        table = self._table()
        new = table[slot] - self.c - delta / (anorm * lr)
        dc = new - table[slot]
        table[slot] = new
        return dc

    def pack(self, ctx, j, slot, res, weight):
        dc = self.update(slot, res.delta[: self.num_params], res.anorm, ctx.lr)
        return {self.segment: dc.double()}      # stays on the device: the row is written there

    def server_update(self, ctx, seg, scalars):
        c = self.c.double().cpu().numpy() + seg[self.segment] / self.num_clients
        self.c.copy_(torch.from_numpy(c))


class VarianceReduction(_Variates):
    """FedNova's cross-client variance reduction, raw-h rule (FedNova, Wang et al. 2020).

    Every local gradient is corrected by c_i = hbar - h_i, where h_i is client i's raw
    normalised gradient of the last round it reported and hbar = sum_j p_j h_j / sum_j p_j
    over ALL clients. After training, d_i = -Delta_i / (lr ||a_i||_1) includes the
    correction, so h_i = d_i - c_i (also with a proximal term: ||a_i||_1 accounts for mu).

    A client that does not report (dropped by the simulated clock, refused by the update
    guard) keeps its last h_i in hbar, as SAGA keeps a stale gradient (Defazio et al.
    2014), the partial-participation reading that FedNova leaves open. The reporters send
    p_j (h_j_new - h_j_old) and the server adds that sum over the total weight of all
    clients, so sum_i p_i c_i = sum_i p_i (hbar - h_i) = 0 after every round, whoever
    reported: in a round where every client reports, FedNova's average of the d_i cancels
    the corrections exactly. Defined for full participation (every client is in every
    cohort, so ctx.weights holds every client's weight) with weights that stay the same
    from round to round (size, uniform, or FedDisco over the fixed full cohort).

    hbar is kept in float64 on every rank (``vr_hbar``, checkpointed and broadcast); the
    correction vector ``c`` is its copy in the model's dtype. A float32 hbar rounded after
    every increment would drift away from sum_j p_j h_j / sum_j p_j over many rounds.
    """

    table_name, server_name = "vr_h_i", "vr_hbar"
    upload = 0   # h_i is recovered from the update itself

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hbar = np.zeros(self.num_params, dtype=np.float64)
        self.p: np.ndarray | None = None   # (N,) weights of the first round this process ran

    def update(self, slot: int, delta: torch.Tensor, anorm: float, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new raw h_i = d_i - c_i; return (old h_i, new h_i) as stored."""
        table = self._table()
        old = table[slot].clone()
        corr = self.c - old
        table[slot] = -delta / (lr * anorm) - corr
        return old, table[slot]

    def statistics(self, ctx):
        """Check, every round on every rank, the two assumptions of the running hbar."""
        if len(ctx.cohort) != self.num_clients:
            raise RuntimeError(f"local = 'vr' needs every client in every round, got a cohort of "
                               f"{len(ctx.cohort)} of {self.num_clients}; set algorithm.clients_per_round = 0")
        weights = np.asarray(ctx.weights, dtype=np.float64)
        if self.p is None:
            self.p = weights.copy()
        elif not np.array_equal(weights, self.p):
            raise RuntimeError("local = 'vr' keeps hbar as a running weighted mean, which needs weights that do "
                               "not change between rounds; use algorithm.weights = 'size' or 'uniform'")

    def pack(self, ctx, j, slot, res, weight):
        old, new = self.update(slot, res.delta[: self.num_params], res.anorm, ctx.lr)
        # The difference of the stored rows, so that the sums telescope to sum_j p_j h_j as stored.
        return {self.segment: (new.double() - old.double()).mul_(weight)}

    def server_update(self, ctx, seg, scalars):
        # ctx.weights covers every client (checked in statistics): the total static weight
        self.hbar = self.hbar + seg[self.segment] / float(np.sum(ctx.weights))
        self.c.copy_(torch.from_numpy(self.hbar))

    def state(self) -> list:
        def set_hbar(value):
            self.hbar = np.array(value, dtype=np.float64, copy=True)
            self.c.copy_(torch.from_numpy(self.hbar))

        table = super().state()[0]
        return [table, ServerArray(self.server_name, lambda: self.hbar, set_hbar, broadcast=True)]


def server_momentum_state(opt) -> ServerArray:
    """The server optimizer's momentum buffer as rank-0 state (None until the first step)."""
    def set_buf(value):
        opt.buf = np.array(value, copy=True)

    return ServerArray("server_momentum", lambda: opt.buf, set_buf)
