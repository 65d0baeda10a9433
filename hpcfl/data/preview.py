"""Human-readable views of a partition: a text summary and a clients x classes heatmap.

Used by ``hpcfl partition JOB``. Both work from the (clients, classes) count matrix, so
they cost O(clients x classes) and stay fast for 100k clients.
"""

from __future__ import annotations

import numpy as np

from . import class_counts

DETAIL_LIMIT = 50  # above this many clients, print statistics instead of a table
HEATMAP_ROWS = 200  # at most this many client rows are drawn


def gini(values) -> float:
    """Gini coefficient of non-negative values (0 = all equal, -> 1 = one holds all)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    n, total = len(v), v.sum()
    if n == 0 or total == 0:
        return 0.0
    return float((2 * np.arange(1, n + 1) - n - 1) @ v / (n * total))


def _stats(v) -> str:
    v = np.asarray(v)
    q = np.percentile(v, [0, 25, 50, 75, 100])
    return (f"min {q[0]:g}  p25 {q[1]:g}  median {q[2]:g}  p75 {q[3]:g}  max {q[4]:g}  "
            f"mean {v.mean():.4g}")


def summary_from_counts(counts: np.ndarray, num_samples: int | None = None) -> str:
    """Text summary of a (clients, classes) count matrix."""
    counts = np.asarray(counts, dtype=np.int64)
    k, c = counts.shape
    sizes = counts.sum(axis=1)
    ncls = (counts > 0).sum(axis=1)
    used = int(sizes.sum())
    lines = [f"{k} clients, {c} classes, {used} samples assigned"
             + (f" of {num_samples} ({num_samples - used} unused)" if num_samples is not None else "")]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = counts / np.maximum(sizes, 1)[:, None]
        ent = -np.where(share > 0, share * np.log(share), 0.0).sum(axis=1)
    glob = counts.sum(axis=0) / max(used, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(share > 0, share * np.log(share / np.where(glob > 0, glob, 1)), 0.0).sum(axis=1)
    if k <= DETAIL_LIMIT:
        width = max(5, len(str(int(counts.max(initial=0)))) + 1)
        head = "client  size  " + "".join(f"{j:>{width}}" for j in range(c))
        lines.append(head)
        for i in range(k):
            lines.append(f"{i:>6} {sizes[i]:>5}  " + "".join(f"{x:>{width}}" for x in counts[i]))
    lines.append(f"size:               {_stats(sizes)}")
    lines.append(f"classes per client: {_stats(ncls)}")
    lines.append(f"label entropy:      {_stats(np.round(ent, 3))}  (uniform = {np.log(c):.3f})")
    lines.append(f"KL to global mix:   {_stats(np.round(kl[sizes > 0], 3)) if (sizes > 0).any() else 'n/a'}")
    lines.append(f"Gini of sizes: {gini(sizes):.3f}   empty clients: {int((sizes == 0).sum())}")
    return "\n".join(lines)


def summary(parts, labels, num_classes: int) -> str:
    """Per-client sizes and class counts for up to 50 clients; statistics for all.

    Statistics: size quartiles, classes per client, per-client label entropy, KL to the
    global label mix, the Gini coefficient of sizes and the number of empty clients.
    """
    return summary_from_counts(class_counts(labels, parts, num_classes), num_samples=len(labels))


def heatmap_png(counts, path: str, title: str = "", log: bool = False) -> str:
    """Write a clients x classes heatmap of ``counts`` to ``path`` (PNG, Agg; no display).

    With more than 200 clients, 200 evenly spaced rows are drawn and the title says so.
    ``log=True`` uses a logarithmic colour scale over counts >= 1 and leaves zero cells
    white, which the title says: with skewed sizes (a few huge clients) a linear scale
    shows everyone else as 0. Returns ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    counts = np.asarray(counts)
    k, c = counts.shape
    rows = np.arange(k)
    if k > HEATMAP_ROWS:
        rows = np.unique(np.linspace(0, k - 1, HEATMAP_ROWS).round().astype(np.int64))
        title = f"{title} ({len(rows)} of {k} clients shown)".strip()
    fig = Figure(figsize=(min(2 + 0.35 * c, 16), min(2 + 0.04 * len(rows) + 2, 12)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    shown, norm, label = counts[rows], None, "samples"
    if log:
        shown = np.ma.masked_less(shown, 1)   # log(0) is undefined: zero cells stay blank
        # vmax > vmin even when every count is 0 or 1, else LogNorm has no range to map
        norm, label = LogNorm(vmin=1, vmax=max(float(counts.max(initial=0)), 2.0)), "samples (log scale)"
        if (counts[rows] == 0).any():
            title = f"{title}\nwhite: no samples of that class".strip()
    im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="viridis", norm=norm)
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if len(rows) <= 30:
        ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    else:
        ticks = np.linspace(0, len(rows) - 1, 6).round().astype(int)
        ax.set_yticks(ticks, [str(rows[t]) for t in ticks])
    if c <= 30:
        ax.set_xticks(range(c))
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=label)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
