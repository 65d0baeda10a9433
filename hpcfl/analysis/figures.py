"""What every hpcfl figure shares: size, fonts, the output file and its format.

Drawing uses matplotlib's object API on an Agg canvas (``Figure`` + ``FigureCanvasAgg``),
never pyplot: that needs no display and, unlike ``matplotlib.use("Agg")``, does not switch
the backend of a notebook that calls these functions. matplotlib is imported inside the
functions, because ``hpcfl.cli`` imports the plotting modules for every command.

Fonts scale with the figure's width (:func:`font_size`), so that a figure printed across a
page's text width (about 7 in) reads at about 9 pt whatever ``--size`` it was drawn at. The
format follows the file name: ``.png`` (raster, ``--size`` pixels at 100 dpi), ``.pdf`` or
``.svg`` (vector, ``--size`` / 100 inches) for a paper.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..errors import HpcflError

DPI = 100
DEFAULT_SIZE = (1200, 800)
SIZE_RANGE = (100, 10000)      # pixels per side accepted by parse_size
FORMATS = (".png", ".pdf", ".svg")
OUT_FIX = "choose a path in a writable directory"
PAGE_INCHES = 7.0              # a page's text width, which font_size aims at
PRINTED_PT = 9.3               # the font size there


def parse_size(text: str) -> tuple[int, int]:
    """``"WxH"`` (pixels) -> ``(W, H)``; each side in :data:`SIZE_RANGE`."""
    parts = str(text).lower().split("x")
    lo, hi = SIZE_RANGE
    try:
        w, h = (int(p) for p in parts)
    except ValueError:
        raise HpcflError(f"--size {text!r} is not WIDTHxHEIGHT in pixels; use e.g. --size 1200x800") from None
    if not (lo <= w <= hi and lo <= h <= hi):
        raise HpcflError(f"--size {text!r}: each side must be {lo}..{hi} pixels; use e.g. --size 1200x800")
    return w, h


def check_out_path(path) -> Path:
    """Raise unless ``path`` names a .png, .pdf or .svg file in an existing, writable directory."""
    path = Path(path)
    if path.is_dir():
        raise HpcflError(f"{path} is a directory; give a file name such as {path / 'plot.png'}")
    if path.suffix.lower() not in FORMATS:
        raise HpcflError(f"{path}: the file name says the format; give a path ending in .png (raster), or .pdf "
                         f"or .svg (vector, for a paper)")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise HpcflError(f"cannot write {path}: {parent} is not a writable directory; {OUT_FIX}")
    return path


def font_size(width_px: int) -> float:
    """Points for a figure ``width_px`` wide that reads at PRINTED_PT when shrunk to PAGE_INCHES."""
    return min(28.0, max(8.0, PRINTED_PT * width_px / DPI / PAGE_INCHES))


@contextlib.contextmanager
def style(size):
    """matplotlib settings for one figure of ``size`` (w, h) pixels: fonts by width, light grid."""
    import matplotlib

    fs = font_size(size[0])
    with matplotlib.rc_context({"font.size": fs, "axes.titlesize": fs, "axes.labelsize": fs,
                                "legend.fontsize": 0.9 * fs, "xtick.labelsize": 0.9 * fs,
                                "ytick.labelsize": 0.9 * fs, "figure.titlesize": fs, "lines.linewidth": 1.8,
                                "svg.fonttype": "none", "pdf.fonttype": 42}):   # text stays text in vectors
        yield


def figure(size):
    """A ``size`` = (width, height) pixel figure on an Agg canvas (no display, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w, h = size
    fig = Figure(figsize=(w / DPI, h / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig, path) -> str:
    """Write ``fig`` in the format of ``path``'s suffix; HpcflError naming the path if it cannot."""
    # No bbox_inches="tight": it would crop the figure and break the requested size.
    path = check_out_path(path)
    try:
        fig.savefig(path, format=path.suffix.lower()[1:], dpi=DPI)
    except OSError as exc:
        raise HpcflError(f"cannot write {path} ({exc.strerror or exc}); {OUT_FIX}") from None
    return str(path)


def run_label(res) -> str:
    """A short name of one run for messages: its ``run.name``, else its run id."""
    return str(res.config.get("run", {}).get("name") or res.attrs.get("run_id", "?"))
