"""Where a run stands in its sweep's grid: the first line of the job file ``hpcfl sweep`` writes
into each point's folder (``<out>/<point>/job.toml``).

Every hpcfl sweep has written that line since sweeps exist, so runs made by any version carry
their point's index; ``hpcfl report`` reads it to list its groups in the order of the grid
(``fedavg, fednova, feddisco, fedlga`` as the job file lists them, not alphabetically). The
writer (:mod:`hpcfl.cli.sweep`) and the reader share the format here.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..inputs import open_regular

POINT_JOB = "job.toml"
HEADER = "Written by hpcfl sweep: point {index} of {job} ({sets})."
_FIRST_LINE = re.compile(r"# Written by hpcfl sweep: point (\d+) of ")


def header(index: int, job, sets: str) -> str:
    """The point job's first comment line (without the '#')."""
    return HEADER.format(index=index, job=job, sets=sets)


def point_index(run_dir: Path) -> int | None:
    """The sweep point index recorded in ``run_dir/job.toml``; None for a run not made by
    ``hpcfl sweep`` (no such file, another first line, or a file that cannot be read or is not a
    regular file)."""
    try:   # a regular file only: a FIFO planted as job.toml must not hold the report (inputs.py)
        with open_regular(Path(run_dir) / POINT_JOB, "rb") as f:
            first = f.readline(4096).decode("utf-8", errors="replace")
    except OSError:
        return None
    m = _FIRST_LINE.match(first)
    return int(m.group(1)) if m else None
