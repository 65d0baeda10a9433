"""The panel of ``results.clients = "sampled"``: the clients whose ``/clients`` rows results.h5 keeps.

The panel is drawn once from the run's seed: every client ``i`` of the ``N`` gets a key ``u_i``,
the ``i``-th of ``N`` uniform draws of the generator keyed by (seed, :data:`hpcfl.rng.CLIENT_PANEL`),
and the panel is the ``ceil(fraction * N)`` clients with the smallest keys (ties to the lower id).
Nothing about ranks or cohorts enters, so the panel, and the rows kept, are the same on any
number of ranks and in every round; a smaller fraction's panel lies inside a larger one's.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .. import rng


def panel_size(num_clients: int, fraction: float) -> int:
    """``ceil(fraction * num_clients)``, at least 1, on the decimal the job gives (0.07 of 100 is 7,
    where the float product 7.000000000000001 would round up to 8)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a panel's fraction must be in (0, 1], got {fraction!r}")
    return max(1, math.ceil(Fraction(repr(float(fraction))) * int(num_clients)))


def client_panel(seed: int, num_clients: int, fraction: float) -> np.ndarray:
    """The panel's client ids, shape (:func:`panel_size`,), int64, increasing.

    Costs one draw and one sort of ``num_clients`` keys (16 bytes a client, once per run).
    """
    keys = rng.numpy_rng(seed, rng.CLIENT_PANEL).random(int(num_clients))
    chosen = np.argsort(keys, kind="stable")[: panel_size(num_clients, fraction)]
    return np.sort(chosen).astype(np.int64)


class PanelFilter:
    """Keeps the rows of a round's records whose client is in the panel (rank 0, in the results writer).

    Parameters
    ----------
    panel : np.ndarray, shape (P,)
        Client ids, non-negative.
    """

    def __init__(self, panel: np.ndarray):
        self.panel = np.asarray(panel, dtype=np.int64)
        # a table by client id: a round's filter is one lookup per cohort member, whatever the panel's size
        self._member = np.zeros(int(self.panel.max()) + 1 if self.panel.size else 0, dtype=bool)
        self._member[self.panel] = True

    def rows(self, clients) -> np.ndarray:
        """Which of a round's rows to keep: a bool mask, shape (k,), for the ``clients`` ids (k,)."""
        ids = np.asarray(clients, dtype=np.int64).reshape(-1)
        keep = np.zeros(ids.shape, dtype=bool)
        inside = (ids >= 0) & (ids < self._member.size)
        keep[inside] = self._member[ids[inside]]
        return keep
