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
each goes through :func:`hpcfl.run` as ``hpcfl run`` does (:func:`hpcfl.cli.run.run_job`), so a
finished point is skipped, a killed one resumes from its checkpoint, and a stop signal
checkpoints and exits 75 as with ``hpcfl run``.
``--only I`` runs point I alone (a job-array task, ``slurm/array_sweep.sbatch``); ``--list``
prints the points and the ``sbatch`` line. Torch is imported only when a point runs.

Each point's job is written to ``<out>/<name>/job.toml`` (the job without ``[sweep]``, with
the point's values, ``--set`` options and ``run.name``): ``hpcfl run`` on that file with the
same ``--out`` is the same run.
"""

from __future__ import annotations

import itertools
import math
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import signals
from ..config.tomltext import _canonical, toml_document, toml_value  # noqa: F401  (re-exported: found here always)
from ..errors import ConfigError, HpcflError
from ..io import safefs
from ..io.sweeppoint import POINT_JOB
from ..io.sweeppoint import header as point_header
from .run import run_job
from ..config.sweepgrid import legacy_names, point_names, read_grid, set_text

ARRAY_TEMPLATE = "slurm/array_sweep.sbatch"
MAX_POINTS = 10_000   # a larger grid needs --max-points (docs/guide.md, Sweeps)
PLANNING = "the sweep's planning stops now (nothing has run yet)"   # what a stop signal does before a point runs


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
    points: Points   # of Point, in grid order, each built when asked for
    notes: tuple = ()   # what the --set options dropped (a replaced component's table)


class Interrupted(Exception):
    """A stop signal arrived while the sweep was being expanded, checked or listed (nothing ran)."""


def _check_stop(doing: str, done: int, total: int) -> None:
    name = signals.stop_requested()
    if name:
        raise Interrupted(f"hpcfl sweep: {name} received while {doing} (at point {done:,} of {total:,}); stopped "
                          f"before running anything, nothing was written. Run the same command again to start")


class Points(Sequence):
    """The points of a grid, each built when it is asked for: a large grid is never held whole
    (its names are, a few dozen bytes each). Indexing and iteration as for a tuple of :class:`Point`."""

    def __init__(self, base: dict, grid: dict, names: list, job_dir: Path):
        self.base, self.grid, self.names, self.job_dir = base, grid, names, job_dir

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        i = int(i) + (len(self) if i < 0 else 0)
        if not 0 <= i < len(self):
            raise IndexError(f"point {i} of {len(self)}")
        from .. import config

        combo, rest = [], i
        for values in reversed(list(self.grid.values())):   # first key outermost: the last varies fastest
            rest, digit = divmod(rest, len(values))
            combo.append(values[digit])
        sets = tuple(set_text(k, v) for k, v in zip(self.grid, reversed(combo)))
        table = _anchor(config.apply_overrides(self.base, list(sets) + [f"run.name={self.names[i]}"]), self.job_dir)
        return Point(i, self.names[i], sets, table)


def check_point(point: Point, job_dir=None) -> None:
    """Raise ConfigError naming ``point`` when its job is invalid. ``job_dir``: the sweep job's folder,
    where a plug-in's module is looked for (imported here, it is the one the points' runs find)."""
    from .. import config

    try:
        config.from_dict(point.table, job_dir)
    except ConfigError as exc:
        raise ConfigError([f"[sweep] point {point.index} ({point.name}): {p}" for p in exc.problems]) from None


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


def expand(job, overrides: list[str] | None = None, out=None, max_points: int = MAX_POINTS,
           check: bool = True) -> Sweep:
    """Read a sweep job, apply ``--set`` options, expand and (``check``) validate every point.

    Parameters
    ----------
    job : path of a TOML job file with a ``[sweep]`` table
    overrides : ``--set`` texts applied to every point (must not touch a swept key)
    out : the sweep's folder; default ``runs/<run.name>``
    max_points : a grid with more points is refused (:data:`MAX_POINTS`; ``--max-points``)
    check : validate every point's job here (``--list`` validates each as it prints it instead)

    Raises ConfigError naming the first point whose job is invalid, and the problem, or a grid
    over the limit; :class:`Interrupted` when a stop signal arrives meanwhile.
    """
    from .. import config

    overrides = list(overrides or [])
    base, grid = read_job(job)
    _check_overrides(grid, overrides)
    total = math.prod(len(v) for v in grid.values())
    if total > max_points:
        shape = " x ".join(f"{k} ({len(v)})" for k, v in grid.items())
        raise ConfigError(f"[sweep] has {total:,} points ({shape}), more than the limit of {max_points:,}: the points "
                          f"run one after another, and even checking or listing them takes about 5 ms each. Make "
                          f"the grid smaller or split it into several jobs, or raise the limit with --max-points "
                          f"{total}")
    notes: list = []
    base = config.apply_overrides(base, overrides, notes)
    name = base.get("run", {}).get("name", "run") if isinstance(base.get("run"), dict) else "run"
    if out is None and not (isinstance(name, str) and config.RUN_NAME.fullmatch(name) and name not in (".", "..")):
        raise ConfigError(f"run.name = {name!r} must be a plain name (letters, digits, '.', '_', '-'): the sweep "
                          f"writes to runs/<run.name>; fix it or pass --out DIR")
    combos = list(itertools.product(*grid.values()))   # at most max_points tuples
    names = point_names(grid, combos)
    sweep_out = Path(out) if out else Path("runs") / name
    old = legacy_names(grid, combos)
    del combos
    if old != names and any((sweep_out / o / "results.h5").exists() for o in old) \
            and not any((sweep_out / n).exists() for n in names):
        names = old   # a sweep begun by an older hpcfl goes on in its folders (finished points skipped)
        notes.append(f"{sweep_out} holds this sweep's points under their earlier names (e.g. {old[0]}): they keep "
                     f"them")
    points = Points(base, grid, names, Path(job).resolve().parent)
    if check:
        for point in points:
            _check_stop("checking the grid's points", point.index, total)
            check_point(point, points.job_dir)
    return Sweep(Path(job), sweep_out, grid, points, tuple(notes))


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

def listing(sweep: Sweep, overrides: list[str]):
    """What ``--list`` prints, line by line as each point is built and checked (a generator): the
    grid, one line per point, the sbatch line for a job array. Raises ConfigError at the first
    invalid point, :class:`Interrupted` when a stop signal arrives."""
    n = len(sweep.points)
    shape = " x ".join(f"{k} ({len(v)})" for k, v in sweep.grid.items())
    width = max(len(name) for name in sweep.points.names)   # from the names: no point is built for it
    yield f"{sweep.job}: {n} point(s), {shape}; each into {sweep.out}/<name>"
    yield f"{'index':>5}  {'name':<{width}}  settings"
    for p in sweep.points:
        _check_stop("listing the grid's points", p.index, n)
        check_point(p, sweep.points.job_dir)
        yield f"{p.index:>5}  {p.name:<{width}}  " + " ".join(f"--set {shlex.quote(s)}" for s in p.sets)
    yield ""
    yield "As a Slurm job array (task i runs point i, into runs/sweep/$HPCFL_SWEEP/<name>), from the repository root:"
    yield (f"  JOB={shlex.quote(str(sweep.job))} HPCFL_SWEEP={shlex.quote(sweep.out.name)} "
           f"sbatch --array=0-{n - 1} {ARRAY_TEMPLATE}")
    if overrides:
        yield "  (the array tasks do not get this command's --set options: put them in the job file)"


def write_point_job(sweep: Sweep, point: Point) -> Path:
    """Write ``<out>/<name>/job.toml`` (atomically: array tasks may share the sweep folder)."""
    folder = sweep.out / point.name
    # the first line is also the record of the point's place in the grid (hpcfl report's order)
    header = (point_header(point.index, sweep.job, " ".join(point.sets)) + "\n"
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

def agreed(comm, err: HpcflError | None) -> int:
    """Collective: 0 when no rank failed, else the first failed rank's exit code, its message printed once."""
    from ..engine.planning import agree

    try:
        agree(comm, err, "the sweep point's job file")
    except HpcflError as exc:
        if comm.rank == 0:
            print(exc, file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


def run_point(sweep: Sweep, point: Point, comm) -> int:
    """Collective: run one point as ``hpcfl run`` does (:func:`hpcfl.cli.run.run_job`); returns its exit code.

    The point is planned as ``hpcfl run`` would: finished (one line, nothing trained), resume
    from the newest checkpoint, or fresh.
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
    code = agreed(comm, err)   # also the barrier after which every rank can read the point's job
    return code or run_job(folder / POINT_JOB, folder, [], False, comm)


def _state(path: Path) -> str:
    """The status of a point's results file; "" when there is none or it cannot be read (the run says why)."""
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
    s.add_argument("--max-points", type=int, default=MAX_POINTS, metavar="N",
                   help=f"refuse a grid of more than N points (default {MAX_POINTS:,})")


def main(args, comm) -> int:
    from ..parallel.exits import EXIT_DIVERGED, EXIT_INPUT, EXIT_RESUMABLE, exit_all

    signals.install(PLANNING)   # a stop signal from here on is a stop request: planning ends at once
    err, stop, sweep, chosen = None, None, None, ()
    try:
        sweep = expand(args.job, args.overrides, args.out, args.max_points, check=not args.list)
        chosen = select(sweep, args.only)
    except HpcflError as exc:
        err = exc
    except Interrupted as exc:
        stop = str(exc)
    stops = [s for s in comm.allgather(stop) if s]
    if stops:
        if comm.rank == 0:
            print(stops[0], file=sys.stderr, flush=True)
        exit_all(EXIT_RESUMABLE)
    code = agreed(comm, err)
    if code:
        return code
    if comm.rank == 0:
        for note in sweep.notes:   # as hpcfl run says it: a dropped table must not go unnoticed
            print(f"hpcfl sweep: note: {note}", flush=True)
    if args.list:   # rank 0 prints as it goes; every rank ends with its code
        code = 0
        if comm.rank == 0:
            try:
                for line in listing(sweep, args.overrides):
                    print(line)
            except HpcflError as exc:
                code = EXIT_INPUT
                print(exc, file=sys.stderr, flush=True)
            except Interrupted as exc:
                code = EXIT_RESUMABLE
                print(exc, file=sys.stderr, flush=True)
            sys.stdout.flush()
        return comm.bcast(code, root=0)

    signals.install()   # from here on a stop is a run's: a checkpoint at the end of the round, exit 75
    for point in chosen:
        code = run_point(sweep, point, comm)
        if code and code != EXIT_DIVERGED:   # a diverged point is a result; the next point still runs
            return code
    signals.ignore()   # every point is done: a late stop signal must not turn exit 0 into a kill
    if args.only is None and comm.rank == 0:
        print(f"hpcfl sweep: {len(chosen)} point(s) finished in {sweep.out}", flush=True)
        try:
            print(_report(sweep), flush=True)
        except HpcflError as exc:   # every point is finished: say why there is no table, still exit 0
            print(f"hpcfl sweep: no summary table: {exc}", file=sys.stderr, flush=True)
    return 0
