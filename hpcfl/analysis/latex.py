"""``hpcfl report --format latex``: the report as a booktabs table, ready for ``\\input``.

The cells are those of the text table (:mod:`.tables`, the precision rules of
:mod:`.precision`), with LaTeX's special characters escaped (``_ % & # $ { } ~ ^ \\``) and
``±`` written ``$\\pm$``. The notes become the caption; warnings (unmatched seeds, a seed
twice) become ``%`` comments above the table, where they are seen and not printed. The
``status`` column is left out when every run finished and ``rounds`` when every group ran the
same number (the caption says so). The preamble needs ``\\usepackage{booktabs}``.
"""

from __future__ import annotations

import numpy as np

# what a cell may hold that LaTeX reads otherwise; one pass, so a replacement is never re-escaped
_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
            "±": r"$\pm$", "Δ": r"$\Delta$", "↳": r"$\hookrightarrow$", "×": r"$\times$", "≥": r"$\geq$",
            "≤": r"$\leq$", "\n": " "}


def escape(text: str) -> str:
    """``text`` as LaTeX source that prints it (``a_b 5%`` -> ``a\\_b 5\\%``, ``±`` -> ``$\\pm$``)."""
    return "".join(_ESCAPES.get(c, c) for c in str(text))


def _same_rounds(groups) -> int | None:
    rounds = {g.mean["rounds"] for g in groups}
    flat = all(g.std["rounds"] in (0.0, None) or not np.isfinite(g.std["rounds"]) for g in groups)
    return int(next(iter(rounds))) if len(rounds) == 1 and flat and np.isfinite(next(iter(rounds))) else None


def latex_columns(groups, cols) -> tuple[list, list[str]]:
    """The columns worth a paper's table, and what the caption says instead of the others."""
    said = []
    heads = [c[0] for c in cols]
    drop = set()
    if "status" in heads and all(g.running == 0 and g.diverged == 0 for g in groups):
        drop.add("status")
        said.append("every run finished")
    n = _same_rounds(groups)
    if "rounds" in heads and n is not None:
        drop.add("rounds")
        said.append(f"{n} rounds each")
    return [c for c in cols if c[0] not in drop], said


def render_latex(cols, rows: list[list[str]], notes: list[str], warnings: list[str], said: list[str] = ()) -> str:
    """A ``table`` environment holding a booktabs ``tabular``.

    Parameters
    ----------
    cols : the shown columns, (header, group cell, run cell) each
    rows : each row's cell texts, one per column (group rows and any per-run rows)
    notes : the report's notes, put in the caption
    warnings : lines put above the table as ``%`` comments
    said : what the caption says for the columns left out (:func:`latex_columns`)
    """
    spec = "l" + "r" * (len(cols) - 1)
    out = ["% hpcfl report --format latex: needs \\usepackage{booktabs} in the preamble"]
    out += [f"% {w}" for w in warnings]
    caption = "; ".join(list(said) + [n.rstrip(".") for n in notes])
    out += ["\\begin{table}[htbp]", "  \\centering", f"  \\caption{{{escape(caption)}.}}",
            "  \\label{tab:hpcfl-report}", f"  \\begin{{tabular}}{{{spec}}}", "    \\toprule",
            "    " + " & ".join(escape(c[0]) for c in cols) + " \\\\", "    \\midrule"]
    out += ["    " + " & ".join(escape(cell) for cell in row) + " \\\\" for row in rows]
    out += ["    \\bottomrule", "  \\end{tabular}", "\\end{table}"]
    return "\n".join(out) + "\n"
