"""``hpcfl plot --kind clients``: a clients x rounds image of one per-client record.

Rounds are 1-based (``/clients/round``). Integer records (``steps``, ``dropped``, ...) with
few distinct values get one colour per value, with the colour bar ticked at the values
(``dropped`` codes in words); real-valued ones a continuous scale.
"""

from __future__ import annotations

import numpy as np

from ..errors import HpcflError
from ..io.reader import no_client_rows, sampled_rows
from .figures import DEFAULT_SIZE, check_out_path, figure, run_label, save, style

MAX_HEATMAP_ROWS = 1000        # more clients than this: evenly spaced cohort members are drawn
MAX_LEVELS = 24                # an integer record with more distinct values is coloured continuously
DROPPED = {0: "trained", 1: "unavailable", 2: "deadline", 3: "late", 4: "no steps", 5: "refused (guard)"}


def client_unit(res, field: str) -> str | None:
    """The unit of ``/clients/<field>`` as the file records it, or None when it has none."""
    return res.units.get("clients", {}).get(field) or None


def _num_clients(res) -> int:
    ids = np.asarray(res.clients["client"])
    held = int(res.class_counts.shape[0]) if res.class_counts is not None else 0
    return max(held, int(ids.max()) + 1 if ids.size else 0)


def _heatmap_rows(res, n: int) -> np.ndarray:
    """Client ids drawn: all ``n`` clients, or evenly spaced cohort members above the limit; of a run
    that kept a panel's rows (results.clients = "sampled"), the panel's clients."""
    if sampled_rows(res) and res.panel is not None:   # the others' rows would be blank, not "never in a cohort"
        seen = np.unique(np.asarray(res.panel, dtype=np.int64))
    elif n <= MAX_HEATMAP_ROWS:
        return np.arange(n)
    else:
        seen = np.unique(res.clients["client"])   # clients never in a cohort would be blank rows
    if seen.size <= MAX_HEATMAP_ROWS:
        return seen
    pick = np.unique(np.linspace(0, seen.size - 1, min(seen.size, MAX_HEATMAP_ROWS)).round().astype(np.int64))
    return seen[pick]


def client_matrix(res, field: str):
    """Per-client record as a (clients drawn, rounds) masked array.

    Returns
    -------
    rows : np.ndarray, shape (k,)
        Client ids of the rows.
    rounds : np.ndarray, shape (R,)
        Round numbers of the columns (contiguous).
    values : np.ma.MaskedArray, shape (k, R), float64
        Masked where the client was not in that round's cohort or its value is NaN.
    member : np.ndarray of bool, shape (k, R)
        True where the client was in the cohort.
    """
    if field not in res.clients or field in ("round", "client"):
        available = [f for f in sorted(res.clients) if f not in ("round", "client")]
        raise HpcflError(f"unknown per-client field {field!r}; available: {', '.join(available)}")
    if no_client_rows(res):
        raise HpcflError(no_client_rows(res))
    rid = np.asarray(res.clients["round"])
    if rid.size == 0:
        raise HpcflError(f"run {run_label(res)} has no rounds recorded yet; plot it after its first round")
    rows = _heatmap_rows(res, _num_clients(res))
    rounds = np.arange(int(rid.min()), int(rid.max()) + 1)
    cid = np.asarray(res.clients["client"])
    r_idx = np.minimum(np.searchsorted(rows, cid), rows.size - 1)
    keep = rows[r_idx] == cid                      # rows not drawn (subsampled) drop out
    grid = np.full((rows.size, rounds.size), np.nan)
    member = np.zeros(grid.shape, dtype=bool)
    cols = rid[keep] - rounds[0]
    grid[r_idx[keep], cols] = np.asarray(res.clients[field], dtype=np.float64)[keep]
    member[r_idx[keep], cols] = True
    return rows, rounds, np.ma.masked_invalid(grid), member


def levels(res, field: str, values) -> np.ndarray | None:
    """The distinct values of an integer record when few enough for one colour each, else None."""
    kind = np.asarray(res.clients[field]).dtype.kind
    found = np.unique(values.compressed())
    if kind not in "iub" or found.size == 0 or found.size > MAX_LEVELS:
        return None
    return found


def client_heatmap_png(results, field: str, path, size=DEFAULT_SIZE, log: bool = False) -> str:
    """Clients x rounds image of one per-client record (``results.clients[field]``).

    Cells of clients outside the round's cohort are white; cohort members whose value is
    NaN (e.g. train_loss of a client that did not train) are light grey. With more than
    :data:`MAX_HEATMAP_ROWS` clients, evenly spaced cohort members are drawn and the title
    says how many.

    Parameters
    ----------
    results : Results
    field : str
        ``steps``, ``weight``, ``train_loss``, ``dropped``, ``anorm``, ``sim_time`` or a
        policy's field such as ``disco_d`` or ``gsnr``.
    path : str or Path
        .png, .pdf or .svg to write.
    size : (int, int)
        Width and height in pixels (in 1/100 inch for .pdf and .svg).
    log : bool
        A continuous log colour scale (every drawn value must be positive).

    Returns
    -------
    str : ``path``.
    """
    from matplotlib.colors import BoundaryNorm, ListedColormap, LogNorm
    from matplotlib.ticker import MaxNLocator

    rows, rounds, values, member = client_matrix(results, field)
    check_out_path(path)
    n = _num_clients(results)
    if log and values.count() and values.min() <= 0:
        raise HpcflError(f"--log: {field} has values down to {values.min():g}; a log colour scale needs positive "
                         f"values (leave out --log)")
    with style(size):
        fig = figure(size)
        ax = fig.add_subplot(1, 1, 1)
        extent = (rounds[0] - 0.5, rounds[-1] + 0.5, rows.size - 0.5, -0.5)
        no_value = np.ma.masked_where(~(member & values.mask), np.ones(member.shape))
        ax.imshow(no_value, aspect="auto", interpolation="nearest", cmap=ListedColormap(["0.85"]), extent=extent)
        found = None if log else levels(results, field, values)
        if found is None:
            im = ax.imshow(values, aspect="auto", interpolation="nearest", cmap="viridis", extent=extent,
                           norm=LogNorm() if log else None)
        else:   # one colour per value: the image holds each value's index, so each band is one unit wide
            from matplotlib import colormaps

            cmap = colormaps["viridis"].resampled(found.size)
            index = np.ma.masked_array(np.searchsorted(found, values.filled(found[0])), mask=values.mask)
            im = ax.imshow(index, aspect="auto", interpolation="nearest", cmap=cmap,
                           norm=BoundaryNorm(np.arange(found.size + 1) - 0.5, found.size), extent=extent)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("client")
        if rows.size <= 30:
            ax.set_yticks(range(rows.size), [str(r) for r in rows])
        else:
            ticks = np.linspace(0, rows.size - 1, 6).round().astype(int)
            ax.set_yticks(ticks, [str(rows[t]) for t in ticks])
        shown = f" ({rows.size} of {n} clients shown)" if rows.size < n else ""
        if sampled_rows(results):
            shown = f" (panel of {len(results.panel)} of {n} clients: results.clients = sampled" + (
                f", {rows.size} shown)" if rows.size < len(results.panel) else ")")
        ax.set_title(f"{run_label(results)}: {field} per client and round{shown}\n"
                     f"white: not in the round's cohort; grey: in it, no value")
        unit = client_unit(results, field)
        label = field if unit in (None, "1", field) else f"{field} [{unit}]"
        label += ", log scale" if log else ""
        bar = fig.colorbar(im, ax=ax, label=label)
        if found is not None:
            step = max(1, int(np.ceil(found.size / 12)))   # at most about 12 tick labels
            ticks = np.arange(found.size)[::step]              # each at its band's centre
            words = [DROPPED.get(int(v), str(int(v))) if field == "dropped" else f"{v:g}" for v in found[ticks]]
            bar.set_ticks(ticks, labels=words)
            bar.minorticks_off()
        return save(fig, path)
