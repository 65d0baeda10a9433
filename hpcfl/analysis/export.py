"""``hpcfl export`` (its command line is :mod:`hpcfl.cli.export`): every run's per-round records as
one long CSV or Parquet table, or as TensorBoard event files.

- ``csv`` / ``parquet``: one row per run and round (``--table metrics``), per run, round and cohort
  member (``clients``) or per run, evaluated round and client (``client_eval``); the first
  columns say which run (``run``: its directory, ``group``: the label ``hpcfl report`` gives it,
  ``seed``), the others are the results file's arrays unchanged (needs pandas; Parquet also
  pyarrow: ``pip install hpcfl[export]``).
- ``tensorboard``: per run, ``<run>/tensorboard/events.out.tfevents.*`` (or under ``--out``, in the
  run's path relative to the current directory) with one scalar series per finite metric
  (``metrics/<name>``, step = round) and, with ``/client_eval``, the clients' accuracy
  statistics by evaluated round (``clients/accuracy_mean``, ``_worst10``, ``_std``, ``_jain``).
  So ``tensorboard --logdir runs/`` shows every run of a sweep. Written with the ``tensorboard``
  package's event writer; the wall time of a point is its round's end, from the run's start
  and ``/metrics/time_round``, so exporting twice gives the same events.
"""

from __future__ import annotations

import calendar
import os
import time
from pathlib import Path

import numpy as np

from ..errors import HpcflError
from . import runs as R
from .fairness import STATS, by_round, fairness

FORMATS = ("csv", "parquet", "tensorboard")
TABLES = ("metrics", "clients", "client_eval")
TB_FOLDER = "tensorboard"


def _need(module: str, what: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise HpcflError(f"{what} needs the {module} package: pip install 'hpcfl[export]' (pandas, pyarrow, "
                         f"tensorboard)") from None


def table(results: list, labels: dict, name: str = "metrics"):
    """One long DataFrame of ``name`` over the runs: ``run``, ``group``, ``seed`` then the file's columns.

    ``labels``: id(result) -> group label. Runs without that table (``client_eval`` of a run with
    run.eval_clients = false) are left out; none having it is an error.
    """
    pd = _need("pandas", "export to csv or parquet")
    if name not in TABLES:
        raise HpcflError(f"--table {name!r}: choose one of {', '.join(TABLES)}")
    frames = []
    for r in results:
        cols = getattr(r, name)
        if not cols:
            continue
        n = len(cols["round"])
        head = {"run": [str(r.source.parent)] * n, "group": [labels[id(r)]] * n,
                "seed": [r.config.get("run", {}).get("seed")] * n}
        order = ["round"] + [k for k in ("client",) if k in cols] + [k for k in cols if k not in ("round", "client")]
        frames.append(pd.DataFrame({**head, **{k: np.asarray(cols[k]) for k in order}}))
    if not frames:
        raise HpcflError(f"no run has /{name} (per-client evaluation: run.eval_clients = true)")
    return pd.concat(frames, ignore_index=True)


def write_table(paths: list, out, fmt: str, name: str = "metrics", by=None) -> str:
    """CSV or Parquet of :func:`table` over the runs under ``paths``: to ``out``, or, for CSV with
    ``out`` None, returned as text."""
    if fmt not in ("csv", "parquet"):
        raise HpcflError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        if out is None:
            raise HpcflError("--format parquet writes a file: give --out FILE.parquet")
        _need("pyarrow", "export to parquet")
    results = R.load_runs(R.find_runs(list(paths)))
    labels = {id(r): label for label, members in R.group_runs(results, by).items() for r in members}
    df = table(results, labels, name)
    if out is None:
        return df.to_csv(index=False)
    try:
        if fmt == "csv":
            df.to_csv(out, index=False)
        else:
            df.to_parquet(out, index=False)
    except OSError as exc:
        raise HpcflError(f"--out {out} cannot be written ({exc.strerror or exc}); choose a path in a writable "
                         f"directory") from None
    return f"{len(df)} rows of /{name} from {len(results)} run(s) written to {out}"


# --------------------------------------------------------------------------- tensorboard

def _start_time(res) -> float:
    """The run's first start (``/segments``' UTC time) as a Unix time; 0 when unknown."""
    try:
        return float(calendar.timegm(time.strptime(res.segments[0]["started"], "%Y-%m-%dT%H:%M:%SZ")))
    except (IndexError, KeyError, ValueError, TypeError):
        return 0.0


def scalars(res) -> list[tuple[str, int, float, float]]:
    """(tag, step, wall time, value) of every point TensorBoard gets from one run, in write order."""
    m = res.metrics
    rounds = np.asarray(m["round"], dtype=np.int64)
    took = np.nan_to_num(np.asarray(m.get("time_round", np.zeros(rounds.size)), dtype=np.float64))
    wall = dict(zip(rounds.tolist(), (_start_time(res) + np.cumsum(took)).tolist()))
    out = []
    for name in sorted(m):
        if name == "round" or np.asarray(m[name]).dtype.kind not in "fiub":
            continue
        values = np.asarray(m[name], dtype=np.float64)
        out += [(f"metrics/{name}", int(r), wall[int(r)], float(v)) for r, v in zip(rounds, values) if np.isfinite(v)]
    if res.client_eval:
        ev_rounds, per = by_round(res.client_eval, "accuracy")
        for r, acc in zip(ev_rounds.tolist(), per):
            f = fairness(acc)
            out += [(f"clients/accuracy_{k}", int(r), wall.get(int(r), 0.0), f[k]) for k in STATS
                    if np.isfinite(f[k])]
    return out


def _tb_dir(res, out) -> Path:
    run_dir = res.source.parent
    if out is None:
        return run_dir / TB_FOLDER
    try:
        rel = run_dir.relative_to(Path.cwd())
    except ValueError:
        rel = Path(*run_dir.parts[1:])   # an absolute path outside the current directory: mirrored in full
    return Path(out) / rel


def write_tensorboard(paths: list, out=None) -> list[Path]:
    """TensorBoard event files of the runs under ``paths`` (see the module's docstring); returns the
    folders written. A folder's earlier event files (an earlier export) are replaced."""
    _need("tensorboard", "export to tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    written = []
    for res in R.load_runs(R.find_runs(list(paths))):
        folder = _tb_dir(res, out)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("events.out.tfevents.*"):
                old.unlink()
            writer = EventFileWriter(str(folder))
            for tag, step, wall, value in scalars(res):
                summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
                writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))
            writer.close()
        except OSError as exc:
            raise HpcflError(f"cannot write TensorBoard events to {folder} ({exc.strerror or exc}); choose a "
                             f"writable folder with --out") from None
        written.append(folder)
    return written


def export(paths: list, fmt: str, out=None, name: str = "metrics", by=None) -> str:
    """What ``hpcfl export`` prints: the CSV text (CSV without ``out``), or a line saying what was written."""
    if fmt == "tensorboard":
        folders = write_tensorboard(paths, out)
        root = os.path.commonpath([str(f) for f in folders]) if len(folders) > 1 else str(folders[0].parent)
        return (f"TensorBoard events of {len(folders)} run(s) written (tensorboard --logdir {root}):\n"
                + "\n".join(f"  {f}" for f in folders))
    return write_table(paths, out, fmt, name, by)
