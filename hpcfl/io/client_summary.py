"""Per-client statistics over the rounds a client took part in, linear in the rows.

``/clients_summary/<field>_<stat>`` (see :meth:`hpcfl.io.results.ResultsWriter.write_final`)
was a loop over unique clients that scanned every row for each (``values[ids == c]``): quadratic,
about 400 s at 1M rows. Here the rows are grouped by one sort and each statistic is taken per
group: the median fully vectorised, any other statistic of :data:`hpcfl.io.schema.SUMMARIES`
called once per client on its own rows. Both give bitwise what the loop gave.
"""

from __future__ import annotations

import numpy as np

from .schema import SUMMARIES


def per_client(ids: np.ndarray, values: np.ndarray, num_clients: int, how: str) -> np.ndarray:
    """``SUMMARIES[how]`` of each client's values, NaN where a client has no finite value.

    Parameters
    ----------
    ids : np.ndarray, shape (rows,)
        Client id of each row, in 0 .. num_clients - 1.
    values : np.ndarray, shape (rows,)
    num_clients : int
    how : str
        A key of :data:`SUMMARIES` ("median": NaN-ignoring median; "mean": NaN-ignoring mean).

    Returns
    -------
    np.ndarray, shape (num_clients,), float64
    """
    ids = np.asarray(ids, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    out = np.full(num_clients, np.nan)
    # a client is summarised when one of its values is finite (what the loop asked); NaN rows are ignored
    has_finite = np.zeros(num_clients, dtype=bool)
    has_finite[ids[np.isfinite(values)]] = True
    keep = has_finite[ids]
    if how == "median":
        keep &= ~np.isnan(values)   # the median of the rest is nanmedian's
        ids, values = ids[keep], values[keep]
        ids, values = _by_client_then_value(ids, values)
        start = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if ids.size else np.zeros(0, dtype=np.int64)
        count, clients = np.diff(np.r_[start, ids.size]), ids[start]
        lo = values[start + (count - 1) // 2]
        hi = values[start + count // 2]
        # np.median's mean of the two middle values is (lo + hi) / 2; of one value, the value itself
        with np.errstate(over="ignore", invalid="ignore"):   # inf + -inf: NaN, as np.median gives
            out[clients] = np.where(count % 2 == 1, lo, (lo + hi) / 2)
        return out
    fn = SUMMARIES[how]   # on the client's rows as the loop gave them, NaN included (a sum's order is its own)
    ids, values = ids[keep], values[keep]
    order = np.argsort(ids, kind="stable")   # each client's rows in their original order
    ids, values = ids[order], values[order]
    clients, start = np.unique(ids, return_index=True)
    ends = np.r_[start[1:], ids.size]
    for c, a, b in zip(clients.tolist(), start.tolist(), ends.tolist()):
        out[c] = fn(values[a:b])
    return out


def _by_client_then_value(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` and ``values`` (rows,) ordered by client, then by value (what ``np.lexsort`` gives,
    in a third of its time): one argsort of the values, then one sort of unique int64 keys
    client * rows + the value's rank."""
    rows = ids.size
    by_value = np.argsort(values)
    if rows == 0 or (int(ids.max()) + 1) * rows >= 2**62:   # keys would overflow
        order = np.lexsort((values, ids))
        return ids[order], values[order]
    rank = np.empty(rows, dtype=np.int64)
    rank[by_value] = np.arange(rows, dtype=np.int64)
    key = ids * rows + rank
    key.sort()
    order = by_value[key % rows]
    return ids[order], values[order]
