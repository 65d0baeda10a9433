"""``hpcfl export`` (its command line is :mod:`hpcfl.cli.export`): every run's per-round records as
one long CSV or Parquet table, or as TensorBoard event files.

- ``csv`` / ``parquet``: one row per run and round (``--table metrics``), per run, round and cohort
  member (``clients``) or per run, evaluated round and client (``client_eval``); the first
  columns say which run (``run``: its directory, ``group``: the label ``hpcfl report`` gives it,
  ``seed``), the others are the results file's arrays unchanged (needs pandas; Parquet also
  pyarrow: ``pip install hpcfl[export]``). Without ``--format`` the file name's suffix says which
  (``.csv``, ``.parquet``); an unknown suffix is refused.
- ``tensorboard``: per run, ``<run>/tensorboard/events.out.tfevents.*`` (or under ``--out``, in the
  run's path relative to the current directory): see :mod:`.tbevents`. So ``tensorboard --logdir
  runs/`` shows every run of a sweep.

The table file is never written through a link and never replaces one of the runs it reads
(the same file, by any path) or any other HDF5 file: :func:`check_table_out`. It is built in memory
and written to a fresh temporary name, then renamed into place (:func:`write_table_file`), so a
failed export leaves the old file whole. The folders above it are the path the user gave.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from pathlib import Path

import numpy as np

from ..errors import HpcflError
from ..io import safefs
from ..io.h5check import BadFile, has_signature
from ..io.reader import no_client_rows, sampled_rows
from . import runs as R
from . import tbevents

FORMATS = ("csv", "parquet", "tensorboard")
TABLES = ("metrics", "clients", "client_eval")
SUFFIXES = {".csv": "csv", ".parquet": "parquet"}   # the table formats a file name can say


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
    frames, without = [], []
    for r in results:
        cols = getattr(r, name)
        if name == "clients" and no_client_rows(r):   # results.clients = "none": metrics only
            without.append(no_client_rows(r))
            continue
        if not cols:
            continue
        n = len(cols["round"])
        head = {"run": [str(r.source.parent)] * n, "group": [labels[id(r)]] * n,
                "seed": [r.config.get("run", {}).get("seed")] * n}
        order = ["round"] + [k for k in ("client",) if k in cols] + [k for k in cols if k not in ("round", "client")]
        frames.append(pd.DataFrame({**head, **{k: np.asarray(cols[k]) for k in order}}))
    if not frames and without:
        raise HpcflError(without[0] if len(without) == 1 else f"no run has per-client rows: {'; '.join(without)}")
    if not frames:
        raise HpcflError(f"no run has /{name} (per-client evaluation: run.eval_clients = true)")
    return pd.concat(frames, ignore_index=True)


def choose_format(fmt: str | None, out) -> str:
    """The format to write: ``fmt`` when given, else the one ``out``'s suffix says (CSV to stdout
    without ``out``). A suffix no format has, or one that says another table format than ``fmt``,
    is refused, so that a file's name never lies about what it holds (CSV in ``x.parquet``)."""
    known = ", ".join(SUFFIXES)
    suffix = Path(out).suffix.lower() if out is not None else ""
    said = SUFFIXES.get(suffix)
    if fmt is None:
        if out is None:
            return "csv"
        if said is None:
            what = f"hpcfl export knows {known}, not {suffix!r}" if suffix else f"the name has none ({known})"
            raise HpcflError(f"--out {out}: without --format the format is the file name's suffix, and {what}; end "
                             f"the name in one of those, or give --format {' | '.join(FORMATS)} (tensorboard writes "
                             f"into a folder)")
        return said
    if fmt not in FORMATS:
        raise HpcflError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if said is not None and said != fmt:
        raise HpcflError(f"--format {fmt} but --out {out} ends in {suffix}, which says {said}; give a name that "
                         f"matches the format, or leave --format out to take it from the name")
    return fmt


def check_table_out(out: Path, inputs: list[Path], dir_fd: int | None = None) -> None:
    """Raise unless ``out`` may take the table: missing, or a regular file that is neither one of the
    ``inputs`` (results files, compared by device and inode, so through any path or hard link) nor
    any other HDF5 file. A link there, dangling or not, is refused: export never writes through one.
    ``dir_fd``: the open folder holding ``out`` (looked up by its name there)."""
    if out.name in ("", ".", ".."):
        raise HpcflError(f"--out {out} is a folder; give a file name such as {out / 'rounds.csv'}")
    at = out.name if dir_fd is not None else out
    try:
        st = os.lstat(at, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HpcflError(f"--out {out} cannot be checked ({exc.strerror or exc}); choose another path") from None
    if stat.S_ISLNK(st.st_mode):
        raise HpcflError(f"--out {out} is a symbolic link (to {os.readlink(at, dir_fd=dir_fd)}); hpcfl export never "
                         f"writes through a link. Remove the link, or give the path of the file itself")
    if stat.S_ISDIR(st.st_mode):
        raise HpcflError(f"--out {out} is a folder; give a file name such as {out / 'rounds.csv'}")
    if not stat.S_ISREG(st.st_mode):
        raise HpcflError(f"--out {out} is not a regular file (a FIFO, a socket or a device); give a file's path")
    for f in inputs:
        if os.path.samestat(st, os.stat(f)):
            raise HpcflError(f"--out {out} is {f}, the results of a run being exported: writing there would destroy "
                             f"the run. Give another file name, e.g. --out rounds.csv")
    try:
        hdf5 = has_signature(at, dir_fd=dir_fd)
    except (OSError, BadFile) as exc:
        raise HpcflError(f"--out {out} cannot be read to check that it is not an HDF5 file ({exc}); give another "
                         f"file name") from None
    if hdf5:
        raise HpcflError(f"--out {out} is an HDF5 file (a run's results or checkpoint?); hpcfl export never "
                         f"overwrites one. Give another file name, or move that file away first")


def write_table_file(out: Path, data: bytes, inputs: list[Path]) -> None:
    """Write ``data`` to ``out`` through its folder, opened once: the last check of ``out`` and the
    write (a fresh temporary name renamed over it, so never through a link) happen in the same folder,
    whatever is moved meanwhile."""
    try:
        fd = os.open(out.parent, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise HpcflError(f"--out {out} cannot be written: its folder {out.parent} cannot be opened "
                         f"({exc.strerror or exc}); choose a path in a writable directory") from None
    try:
        check_table_out(out, inputs, dir_fd=fd)
        safefs.write_new(Path(out.name), data, dir_fd=fd)
    except OSError as exc:
        raise HpcflError(f"--out {out} cannot be written ({exc.strerror or exc}); choose a path in a writable "
                         f"directory") from None
    finally:
        os.close(fd)


def table_bytes(df, fmt: str) -> bytes:
    """The table as the bytes of a CSV or Parquet file."""
    if fmt == "csv":
        return df.to_csv(index=False).encode()
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def write_table(paths: list, out, fmt: str, name: str = "metrics", by=None) -> str:
    """CSV or Parquet of :func:`table` over the runs under ``paths``: to ``out``, or, for CSV with
    ``out`` None, returned as text."""
    if fmt not in ("csv", "parquet"):
        raise HpcflError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        if out is None:
            raise HpcflError("--format parquet writes a file: give --out FILE.parquet")
        _need("pyarrow", "export to parquet")
    files = R.find_runs(list(paths))
    if out is not None:
        check_table_out(Path(out), files)   # before the runs are read: nothing is loaded for a refused --out
    results = R.load_runs(files)
    labels = {id(r): label for label, members in R.group_runs(results, by).items() for r in members}
    df = table(results, labels, name)
    for note in (sampled_rows(r) for r in results) if name == "clients" else ():
        if note:   # the rows are there, of a panel of clients: said beside the table, which stays the file's columns
            print(f"hpcfl export: note: {note}", file=sys.stderr, flush=True)
    if out is None:
        return df.to_csv(index=False)
    write_table_file(Path(out), table_bytes(df, fmt), files)   # checked again there: reading took a while
    return f"{len(df)} rows of /{name} from {len(results)} run(s) written to {out} ({fmt})"


def write_tensorboard(paths: list, out=None) -> list[Path]:
    """TensorBoard event files of the runs under ``paths`` (:mod:`.tbevents`); returns the folders
    written. Export's own earlier event files there are replaced; no other file is touched."""
    _need("tensorboard", "export to tensorboard")
    return tbevents.write(R.load_runs(R.find_runs(list(paths))), out)


def export(paths: list, fmt: str | None = None, out=None, name: str = "metrics", by=None) -> str:
    """What ``hpcfl export`` prints: the CSV text (CSV without ``out``), or a line saying what was
    written. ``fmt`` None: from ``out``'s suffix (:func:`choose_format`)."""
    fmt = choose_format(fmt, out)
    if fmt == "tensorboard":
        folders = write_tensorboard(paths, out)
        root = os.path.commonpath([str(f) for f in folders]) if len(folders) > 1 else str(folders[0].parent)
        return (f"TensorBoard events of {len(folders)} run(s) written (tensorboard --logdir {root}):\n"
                + "\n".join(f"  {f}" for f in folders))
    return write_table(paths, out, fmt, name, by)
