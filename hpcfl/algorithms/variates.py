"""Control variates: SCAFFOLD (option II) and FedNova's cross-client variance reduction.

Both correct every local gradient by ``c - c_i`` and keep per-client rows ``c_i`` on the
owning rank and a server vector ``c`` that every rank needs, so both are policies on the
state protocol (:mod:`hpcfl.algorithms.protocol`): a :class:`ClientTable`, a broadcast
:class:`ServerArray`, one reduction segment, and one vector more each way on the wire.
"""

from __future__ import annotations

import numpy as np
import torch

from .protocol import ClientTable, Policy, Segment, ServerArray


class _Variates(Policy):
    """Per-client rows (clients on rank, num_params) and a server vector c (num_params,)."""

    segment = "extra"

    def __init__(self, num_local: int, num_params: int, device: torch.device, dtype: torch.dtype,
                 num_clients: int = 0):
        self.num_local, self.num_params, self.num_clients = num_local, num_params, num_clients
        self.device, self.dtype = device, dtype
        self._rows: torch.Tensor | None = None   # allocated at first use: (clients on rank, P)
        self.c = torch.zeros(num_params, device=device, dtype=dtype)

    def _table(self) -> torch.Tensor:
        if self._rows is None:
            self._rows = torch.zeros(self.num_local, self.num_params, device=self.device, dtype=self.dtype)
        return self._rows

    def correction(self, slot: int) -> torch.Tensor:
        """c - c_i, added to every local gradient of the client in ``slot``."""
        return self.c - self._table()[slot]

    def segments(self) -> list[Segment]:
        return [Segment(self.segment, self.num_params)]

    def state(self) -> list:
        def set_rows(rows):
            self._table().copy_(torch.from_numpy(rows))

        def set_c(value):
            self.c.copy_(torch.from_numpy(value))

        return [ClientTable(self.table_name, self.num_params, lambda: self._table().detach().cpu().numpy(),
                            set_rows),
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
        return {self.segment: dc.double().cpu().numpy()}

    def server_update(self, ctx, seg, scalars):
        c = self.c.double().cpu().numpy() + seg[self.segment] / self.num_clients
        self.c.copy_(torch.from_numpy(c))


class VarianceReduction(_Variates):
    """FedNova's cross-client variance reduction, raw-h rule (FedNova, Wang et al. 2020).

    Every local gradient is corrected by c_i = hbar - h_i, where h_i is client i's raw
    normalised gradient of the previous round and hbar = sum_j p_j h_j. After training,
    d_i = -Delta_i / (lr ||a_i||_1) includes the correction, so h_i = d_i - c_i.
    Defined for full participation only.
    """

    table_name, server_name = "vr_h_i", "vr_hbar"
    upload = 0   # h_i is recovered from the update itself

    def update(self, slot: int, delta: torch.Tensor, anorm: float, lr: float) -> torch.Tensor:
        """Store and return the new raw h_i = d_i - c_i."""
        table = self._table()
        corr = self.c - table[slot]
        h = -delta / (lr * anorm) - corr
        table[slot] = h
        return h

    def pack(self, ctx, j, slot, res, weight):
        h = self.update(slot, res.delta[: self.num_params], res.anorm, ctx.lr)
        return {self.segment: h.double().cpu().numpy() * weight}   # p_i h_i for hbar

    def server_update(self, ctx, seg, scalars):
        self.c.copy_(torch.from_numpy(seg[self.segment] / scalars["weight"]))


def server_momentum_state(opt) -> ServerArray:
    """The server optimizer's momentum buffer as rank-0 state (None until the first step)."""
    def set_buf(value):
        opt.buf = np.array(value, copy=True)

    return ServerArray("server_momentum", lambda: opt.buf, set_buf)
