"""Reading the per-client device trace CSV (``system.trace``).

Format: comma-separated, header line required, blank lines ignored, extra columns
ignored. Columns:

``client``
    integer device id, distinct across rows (need not be contiguous).
``seconds_per_step`` or ``seconds_per_sample``
    the one matching ``system.compute_unit``; finite and > 0. Needed when
    ``compute_dist = "trace"``.
``uplink_mbps``, ``downlink_mbps``
    > 0 (``inf`` allowed). Needed when the matching ``*_dist = "trace"``.

Rows are ordered by ascending ``client`` id; simulated client ``c`` uses row
``c mod R`` of that order (R rows), so a short trace is cycled over the clients.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..inputs import open_regular

COMPUTE_COLUMN = {"step": "seconds_per_step", "sample": "seconds_per_sample"}


def read_trace(path: str | Path, columns: list[str]) -> dict[str, np.ndarray]:
    """Read ``path`` and return ``{"client": int64, column: float64, ...}`` sorted by client.

    ``columns`` are the value columns required. Every problem raises
    :class:`ConfigError` naming ``system.trace``, the file and the line.
    """
    path = Path(path)
    where = f"system.trace = {str(path)!r}"
    try:
        with open_regular(path, "r", encoding="utf-8-sig", newline="") as f:   # a FIFO would block start-up
            lines = list(csv.reader(f))
    except OSError as e:
        raise ConfigError(f"{where}: cannot read the file ({e.strerror}); check the path")
    numbered = [(i + 1, row) for i, row in enumerate(lines) if any(c.strip() for c in row)]
    if not numbered:
        raise ConfigError(f"{where}: the file is empty; expected a header line and rows")
    head_line, header = numbered[0]
    header = [h.strip() for h in header]
    need = ["client"] + list(columns)
    missing = [c for c in need if c not in header]
    if missing:
        raise ConfigError(
            f"{where}: line {head_line} (header) lacks column(s) {', '.join(missing)}; "
            f"found {', '.join(header) or '(none)'}"
        )
    index = {c: header.index(c) for c in need}
    rows = numbered[1:]
    if not rows:
        raise ConfigError(f"{where}: no data rows after the header; add one row per device")
    ids = np.empty(len(rows), dtype=np.int64)
    vals = {c: np.empty(len(rows), dtype=np.float64) for c in columns}
    seen: dict[int, int] = {}
    for k, (line, row) in enumerate(rows):
        if len(row) < len(header):
            raise ConfigError(
                f"{where}: line {line} has {len(row)} fields, the header has {len(header)}"
            )
        text = row[index["client"]].strip()
        try:
            cid = int(text)
        except ValueError:
            raise ConfigError(
                f"{where}: line {line}: client = {text!r} is not an integer id"
            ) from None
        if cid < 0 or cid in seen:
            why = "negative" if cid < 0 else f"a duplicate of line {seen.get(cid)}"
            raise ConfigError(f"{where}: line {line}: client = {cid} is {why}")
        seen[cid] = line
        ids[k] = cid
        for c in columns:
            text = row[index[c]].strip()
            try:
                v = float(text)
            except ValueError:
                raise ConfigError(
                    f"{where}: line {line}: {c} = {text!r} is not a number"
                ) from None
            finite_ok = c.endswith("_mbps") or math.isfinite(v)
            if not (v > 0 and finite_ok):
                raise ConfigError(
                    f"{where}: line {line}: {c} = {text!r} must be "
                    f"{'greater than 0' if c.endswith('_mbps') else 'finite and greater than 0'}"
                )
            vals[c][k] = v
    order = np.argsort(ids, kind="stable")
    out = {"client": ids[order]}
    out.update({c: v[order] for c, v in vals.items()})
    return out
