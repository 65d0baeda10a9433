"""``hpcfl sweep JOB``: every point of a job's ``[sweep]`` grid, one after another, in one process.

A job file declares the grid as dotted config keys, each with a non-empty list of values::

    [sweep]
    "algorithm.name" = ["fedavg", "fednova"]
    "run.seed" = [0, 1, 2]

The points are the cartesian product, first key outermost (in file order; quote the keys:
unquoted dotted keys are grouped by section by the TOML parser). Each point is named from its
values (``fedavg_seed-0``: a component's name alone, other keys as leaf, '-', value), runs with
``run.name`` set to that
name, into ``<out>/<name>`` (default ``<out>``: ``runs/<run.name>``). The points run in this
process on the same communicator, so one ``srun``/``mpiexec`` allocation runs the whole grid;
each goes through :func:`hpcfl.cli.run.cmd_run`, so a finished point is skipped, a killed one
resumes from its checkpoint, and a stop signal checkpoints and exits 75 as with ``hpcfl run``.
``--only I`` runs point I alone (a job-array task, ``slurm/array_sweep.sbatch``); ``--list``
prints the points and the ``sbatch`` line. Torch is imported only when a point runs.

Each point's job is written to ``<out>/<name>/job.toml`` (the job without ``[sweep]``, with
the point's values, ``--set`` options and ``run.name``): ``hpcfl run`` on that file with the
same ``--out`` is the same run.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import re
import shlex
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .. import signals
# TOML writing lives in hpcfl/config/tomltext.py; re-exported here, where callers have always found it.
from ..config.tomltext import _canonical, toml_document, toml_value  # noqa: F401
from ..errors import ConfigError, HpcflError
from ..io import safefs
from .run import agree, cmd_run

ARRAY_TEMPLATE = "slurm/array_sweep.sbatch"
POINT_JOB = "job.toml"
_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_MAX_NAME = 128   # config.RUN_NAME's limit


@dataclass(frozen=True)
class Point:
    """One point of the grid.

    index : position in the grid (what ``--only`` and an array task ID select), from 0
    name : the point's run.name and the name of its folder under the sweep's out
    sets : its values as ``--set`` texts, one per sweep key, in key order
    table : its whole job (no ``[sweep]``), ready for :func:`hpcfl.config.from_dict`
    """

    index: int
    name: str
    sets: tuple
    table: dict


@dataclass(frozen=True)
class Sweep:
    """An expanded job: where it came from, where it writes, its keys and its points."""

    job: Path
    out: Path
    grid: dict      # dotted key -> list of values, in file order
    points: tuple   # of Point, in grid order
    notes: tuple = ()   # what the --set options dropped (a replaced component's table)


# ---- the grid --------------------------------------------------------------------------------

def read_grid(raw) -> dict:
    """Validate a ``[sweep]`` table; returns {dotted key: list of values} in file order."""
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep must be a table ([sweep] with \"section.key\" = [values...]), found {raw!r}")
    from ..config import flatten  # unquoted dotted keys were grouped by section by TOML

    grid, problems = flatten(raw), []
    for key, values in grid.items():
        if len(key.split(".")) < 2 or not all(key.split(".")):
            problems.append(f"sweep key {key!r} must be a dotted config key, e.g. \"algorithm.lr\" = [0.01, 0.1]")
        elif not isinstance(values, list):
            problems.append(f"sweep.{key!r} = {values!r} must be a list of values, e.g. \"{key}\" = "
                            f"[{toml_value(values) if isinstance(values, (bool, int, float, str)) else '...'}]")
        elif not values:
            problems.append(f"sweep.{key!r} is an empty list; give it at least one value, or remove the key")
        if key == "run.name":
            problems.append("sweep key 'run.name' cannot be swept: each point's run.name is its point name")
    if not grid:
        problems.append("the [sweep] table is empty; add \"section.key\" = [values...] lines, or use hpcfl run")
    if problems:
        raise ConfigError(problems)
    return grid


def set_text(key: str, value) -> str:
    """``key=value`` as ``--set`` reads it: the plain value when it parses back the same, else TOML."""
    from ..config import parse_override

    plain = f"{key}={value}" if isinstance(value, str) else None
    if plain is not None and parse_override(plain)[1] == value:
        return plain
    return f"{key}={toml_value(value)}"


def _labels(keys: list[str]) -> dict:
    """Each key's label in point names: its leaf, or the whole key when leaves collide; None for a
    component's name (``algorithm.name``, ``model.name``, ``data.dataset``, ``data.partition``),
    whose value names itself: ``fedavg_seed-0``, not ``name-fedavg_seed-0`` (``name`` is also
    ``run.name`` and ``model.name``)."""
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: None if k.endswith(".name") or k in BARE_KEYS else leaf if leaves.count(leaf) == 1 else k
            for k, leaf in zip(keys, leaves)}


BARE_KEYS = ("data.dataset", "data.partition")   # with every "<section>.name": the value alone in point names


def legacy_names(grid: dict, combos: list[tuple]) -> list[str]:
    """The names earlier hpcfl versions gave the points (``name-fedavg_seed-0``: leaf, '-', value for
    every key), so that a sweep started then resumes in its own folders."""
    leaves = [k.rsplit(".", 1)[-1] for k in grid]
    labels = {k: leaf if leaves.count(leaf) == 1 else k for k, leaf in zip(grid, leaves)}
    return ["_".join(f"{labels[k]}-{_safe(v)}" for k, v in zip(grid, combo)) for combo in combos]


def _safe(value) -> str:
    """A value as a file-name fragment: runs of other characters than [A-Za-z0-9._-] become '-'."""
    text = value if isinstance(value, str) else toml_value(value)
    return "-".join(_NAME_CHARS.findall(text)) or "_"


def point_names(grid: dict, combos: list[tuple]) -> list[str]:
    """Names of the points ``combos`` (value tuples in ``grid``'s key order), unique as folder names.

    Unique by construction except when two values look alike once made safe ("a/b", "a:b"):
    those points get their index appended. Where that still collides (a third value "a-b_1"),
    or names differ only in letter case (one folder on a case-insensitive filesystem), each
    colliding point gets a hash of its exact values instead. Names too long for run.name are
    shortened and made unique with a hash of the full name. Raises ConfigError if two points
    would still share a folder, so that nothing runs and no point's job overwrites another's.
    """
    labels = _labels(list(grid))
    base = ["_".join(_safe(v) if labels[k] is None else f"{labels[k]}-{_safe(v)}" for k, v in zip(grid, combo))
            for combo in combos]
    folded = Counter(n.casefold() for n in base)
    names = [n if folded[n.casefold()] == 1 else f"{n}_{i}" for i, n in enumerate(base)]
    folded = Counter(n.casefold() for n in names)
    for i, combo in enumerate(combos):
        if folded[names[i].casefold()] > 1:
            names[i] = f"{base[i]}-{_digest(_canonical(list(combo)))}"
    names = [n if len(n) <= _MAX_NAME else f"{n[:_MAX_NAME - 9]}-{_digest(n)}" for n in names]
    folded = Counter(n.casefold() for n in names)
    clash = [n for n in names if folded[n.casefold()] > 1]
    if clash:
        raise ConfigError(f"[sweep] points {clash[0]!r} and another would share one folder; make their values "
                          f"differ in letters or digits")
    return names


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


# ---- expanding a job -------------------------------------------------------------------------

def read_job(path) -> tuple[dict, dict]:
    """(the job without ``[sweep]``, its grid); raises when the job has no ``[sweep]`` table."""
    from .. import config

    table = config.read_job(path)
    if "sweep" not in table:
        raise ConfigError(f"job file {str(path)!r} has no [sweep] table; add one (\"section.key\" = [values...]) "
                          f"or run it with hpcfl run")
    raw = table.pop("sweep")
    return table, read_grid(raw)


def _check_overrides(grid: dict, overrides: list[str]) -> None:
    from ..config import parse_override

    for text in overrides:
        key = ".".join(parse_override(text)[0])
        clash = [k for k in grid if k == key or k.startswith(key + ".") or key.startswith(k + ".")]
        if clash:
            raise ConfigError(f"--set {text!r} sets {key}, which the [sweep] table varies ({clash[0]}); drop the "
                              f"--set, or change the values in [sweep]")


def _anchor(table: dict, job_dir: Path) -> dict:
    """Point jobs live in ``<out>/<name>/``: keep a relative system.trace relative to the sweep job."""
    trace = table.get("system", {}).get("trace") if isinstance(table.get("system"), dict) else None
    if isinstance(trace, str) and not Path(trace).is_absolute():
        table["system"]["trace"] = str(job_dir / trace)
    return table


def expand(job, overrides: list[str] | None = None, out=None) -> Sweep:
    """Read a sweep job, apply ``--set`` options, expand and validate every point.

    Parameters
    ----------
    job : path of a TOML job file with a ``[sweep]`` table
    overrides : ``--set`` texts applied to every point (must not touch a swept key)
    out : the sweep's folder; default ``runs/<run.name>``

    Raises ConfigError naming the first point whose job is invalid, and the problem.
    """
    from .. import config

    overrides = list(overrides or [])
    base, grid = read_job(job)
    _check_overrides(grid, overrides)
    notes: list = []
    base = config.apply_overrides(base, overrides, notes)
    name = base.get("run", {}).get("name", "run") if isinstance(base.get("run"), dict) else "run"
    if out is None and not (isinstance(name, str) and config.RUN_NAME.fullmatch(name) and name not in (".", "..")):
        raise ConfigError(f"run.name = {name!r} must be a plain name (letters, digits, '.', '_', '-'): the sweep "
                          f"writes to runs/<run.name>; fix it or pass --out DIR")
    combos = list(itertools.product(*grid.values()))
    names = point_names(grid, combos)
    sweep_out = Path(out) if out else Path("runs") / name
    old = legacy_names(grid, combos)
    if old != names and any((sweep_out / o / "results.h5").exists() for o in old) \
            and not any((sweep_out / n).exists() for n in names):
        names = old   # a sweep begun by an older hpcfl goes on in its folders (finished points skipped)
        notes.append(f"{sweep_out} holds this sweep's points under their earlier names (e.g. {old[0]}): they keep "
                     f"them")
    job_dir = Path(job).resolve().parent
    points = []
    for i, (combo, pname) in enumerate(zip(combos, names)):
        sets = tuple(set_text(k, v) for k, v in zip(grid, combo))
        table = _anchor(config.apply_overrides(base, list(sets) + [f"run.name={pname}"]), job_dir)
        try:
            config.from_dict(table)
        except ConfigError as exc:
            raise ConfigError([f"[sweep] point {i} ({pname}): {p}" for p in exc.problems]) from None
        points.append(Point(i, pname, sets, table))
    return Sweep(Path(job), sweep_out, grid, tuple(points), tuple(notes))


def select(sweep: Sweep, only: int | None) -> tuple:
    """The points to run: all, or the one ``--only`` names."""
    if only is None:
        return sweep.points
    n = len(sweep.points)
    if not 0 <= only < n:
        raise HpcflError(f"--only {only}: {sweep.job} has {n} sweep point(s), 0 to {n - 1} (hpcfl sweep "
                         f"{sweep.job} --list shows them; a job array needs --array=0-{n - 1})")
    return (sweep.points[only],)


# ---- output ----------------------------------------------------------------------------------

def listing(sweep: Sweep, overrides: list[str]) -> str:
    """What ``--list`` prints: the grid, one line per point, the sbatch line for a job array."""
    n = len(sweep.points)
    shape = " x ".join(f"{k} ({len(v)})" for k, v in sweep.grid.items())
    width = max(len(p.name) for p in sweep.points)
    lines = [f"{sweep.job}: {n} point(s), {shape}; each into {sweep.out}/<name>",
             f"{'index':>5}  {'name':<{width}}  settings"]
    for p in sweep.points:
        lines.append(f"{p.index:>5}  {p.name:<{width}}  " + " ".join(f"--set {shlex.quote(s)}" for s in p.sets))
    lines += ["", "As a Slurm job array (task i runs point i, into runs/sweep/$HPCFL_SWEEP/<name>), from the "
                  "repository root:",
              f"  JOB={shlex.quote(str(sweep.job))} HPCFL_SWEEP={shlex.quote(sweep.out.name)} "
              f"sbatch --array=0-{n - 1} {ARRAY_TEMPLATE}"]
    if overrides:
        lines.append("  (the array tasks do not get this command's --set options: put them in the job file)")
    return "\n".join(lines)


def write_point_job(sweep: Sweep, point: Point) -> Path:
    """Write ``<out>/<name>/job.toml`` (atomically: array tasks may share the sweep folder)."""
    folder = sweep.out / point.name
    header = (f"Written by hpcfl sweep: point {point.index} of {sweep.job} ({' '.join(point.sets)}).\n"
              f"hpcfl run on this file with --out {folder} is the same run.")
    text = toml_document(point.table, header)
    path = folder / POINT_JOB
    try:
        folder.mkdir(parents=True, exist_ok=True)
        safefs.write_new(path, text.encode())   # a fresh temporary name, never a planted link
    except OSError as exc:
        raise HpcflError(f"cannot write {path} ({exc.strerror or exc}); choose a directory you can write with "
                         f"--out") from None
    return path


# ---- running ---------------------------------------------------------------------------------

def run_point(sweep: Sweep, point: Point, comm) -> int:
    """Collective: run one point through ``hpcfl run``'s code path; returns its exit code.

    ``cmd_run`` plans the point as ``hpcfl run`` would: finished (one line, nothing trained),
    resume from the newest checkpoint, or fresh. Exits other than 0 (2, 3, 75) end the process
    inside ``cmd_run``, on every rank.
    """

    folder = sweep.out / point.name
    err = None
    if comm.rank == 0:
        if _state(folder / "results.h5") != "finished":   # else cmd_run's one line
            print(f"hpcfl sweep: point {point.index} (of 0-{len(sweep.points) - 1}): {point.name}", flush=True)
        try:
            write_point_job(sweep, point)
        except HpcflError as exc:
            err = exc
    agree(comm, err)   # also the barrier after which every rank can read the point's job
    signals.install()       # the previous point's cmd_run ended by ignoring stop signals
    args = argparse.Namespace(cmd="run", job=str(folder / POINT_JOB), overrides=[], out=str(folder), force=False,
                              allow_change=[])
    return cmd_run(args, comm)   # which releases the point's lock on every path that returns


def _state(path: Path) -> str:
    """The status of a point's results file; "" when there is none or it cannot be read (cmd_run says why)."""
    from ..io import results

    try:
        return (results.status(path) or ("",))[0]
    except HpcflError:
        return ""


def _report(sweep: Sweep) -> str:
    """The summary table over the sweep's folder (every point's run, and any other run put there)."""
    from ..analysis.report import report_text

    return report_text([str(sweep.out)], fmt="text")


def add_parser(sub) -> None:
    s = sub.add_parser("sweep", help="run every point of a job's [sweep] grid, one after another",
                       description="Run the points of a job's [sweep] table (the cartesian product of its "
                                   "values) one after another in this process, each into <out>/<point name>; "
                                   "finished points are skipped and killed ones resume.")
    s.add_argument("job", help="TOML job file with a [sweep] table, e.g. jobs/sweep_quickstart.toml")
    s.add_argument("--out", help="sweep directory (default runs/<run.name>); point i goes to <out>/<its name>")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every point (not a swept key; repeatable)")
    s.add_argument("--list", action="store_true",
                   help="print the points and the sbatch line for a job array; run nothing")
    s.add_argument("--only", type=int, metavar="I",
                   help="run point I only (an array task; no summary table)")


def main(args, comm) -> int:

    signals.install()   # as for hpcfl run: a stop signal from here on is a stop request
    err, sweep, chosen = None, None, ()
    try:
        sweep = expand(args.job, args.overrides, args.out)
        chosen = select(sweep, args.only)
    except HpcflError as exc:
        err = exc
    agree(comm, err)
    if comm.rank == 0:
        for note in sweep.notes:   # as hpcfl run says it: a dropped table must not go unnoticed
            print(f"hpcfl sweep: note: {note}", flush=True)
    if args.list:
        if comm.rank == 0:
            print(listing(sweep, args.overrides), flush=True)
        return 0
    from ..parallel.exits import EXIT_DIVERGED

    for point in chosen:
        code = run_point(sweep, point, comm)
        if code and code != EXIT_DIVERGED:   # a diverged point is a result; the next point still runs
            return code
    if args.only is None and comm.rank == 0:
        print(f"hpcfl sweep: {len(chosen)} point(s) finished in {sweep.out}", flush=True)
        try:
            print(_report(sweep), flush=True)
        except HpcflError as exc:   # every point is finished: say why there is no table, still exit 0
            print(f"hpcfl sweep: no summary table: {exc}", file=sys.stderr, flush=True)
    return 0
