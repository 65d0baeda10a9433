"""Finding runs, grouping them by the config keys that differ, and their quality curve.

Shared by ``hpcfl report`` (:mod:`.report`) and ``hpcfl plot`` (:mod:`.plots`). A *group* is
the set of runs that differ only in keys that identify a replicate (``run.seed``,
``run.name``) or do not change results (checkpointing, devices, ...): typically one
configuration over several seeds.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import flatten
from ..errors import HpcflError
from ..io.rundir import ASIDE_PREFIX
from . import words as W
from .fairness import final as final_fairness

RESULTS_NAME = "results.h5"
# Keys that name a replicate or do not change the model and metrics (results are bitwise
# the same across placements and evaluation chunkings; threads and devices change them only
# in the last bits): never a grouping key. runtime.reduce = "float" does change results.
IGNORED_KEYS = frozenset({"run.name", "run.seed", "runtime.progress", "runtime.threads", "runtime.device",
                          "runtime.share_gpus", "runtime.placement", "runtime.eval_batch_size", "runtime.lanes", "runtime.step",
                          "data.cache",
                          "run.eval_clients", "run.eval_clients_min"})
IGNORED_SECTIONS = ("checkpoint.", "watchdog.", "results.")
_MISSING = object()   # a key one run's config lacks (e.g. a sub-table of another algorithm)


# --------------------------------------------------------------------------- finding runs

def _runs_under(directory: Path) -> list[Path]:
    """Results files in ``directory``'s subdirectories, not descending into a run's own directory.

    A run directory's ``replaced-*`` folders (old runs set aside by ``--force``) and hidden
    folders are skipped, so a sweep directory yields each run once.
    """
    found = []
    for root, dirs, files in os.walk(directory):
        if RESULTS_NAME in files:
            found.append(Path(root) / RESULTS_NAME)
            dirs[:] = []          # a run's own sub-folders (checkpoints) hold no other run
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", ASIDE_PREFIX)))
    return found


def find_runs(paths: list[str]) -> list[Path]:
    """The results files named by ``paths``, sorted and without duplicates.

    Parameters
    ----------
    paths : list of str or Path
        Each is a run directory (holding ``results.h5``), a results file, or a directory
        whose subdirectories (at any depth, e.g. a sweep's output) hold runs.

    Returns
    -------
    list of Path
        Absolute paths of ``results.h5`` files.

    Raises
    ------
    HpcflError
        For a path that does not exist or holds no run.
    """
    if not paths:
        raise HpcflError("no runs given: name run directories, results.h5 files, or a directory holding runs "
                         "(e.g. a sweep's output)")
    found = set()
    for p in map(Path, paths):
        if p.is_file():
            runs = [p]
        elif p.is_dir():
            runs = [p / RESULTS_NAME] if (p / RESULTS_NAME).is_file() else _runs_under(p)
        else:
            raise HpcflError(f"{p}: no such file or directory; expected a run directory, a results.h5 file, or a "
                             f"directory holding runs")
        if not runs:
            raise HpcflError(f"{p}: no run found (no {RESULTS_NAME} in it or in its subdirectories); expected a run "
                             f"directory (the --out of hpcfl run), a {RESULTS_NAME} file, or a directory holding runs")
        found.update(r.resolve() for r in runs)
    return sorted(found)


def load_runs(files: list[Path], warn=None) -> list:
    """Load each results file; a damaged one is skipped with a warning naming it.

    Parameters
    ----------
    files : list of Path
    warn : callable(str), optional
        Receives one line per skipped file; default: printed to stderr.

    Returns
    -------
    list of hpcfl.results.Results, in the order of ``files``, damaged ones left out (each
    result's ``source`` is its file)

    Raises
    ------
    HpcflError
        When no file can be read.
    """
    from ..io.results import load

    warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
    out, bad = [], []
    for f in files:
        try:
            out.append(load(f, lazy=True))   # /clients, /client_eval read only if used (a large cohort's GBs)
        except HpcflError as exc:   # damaged, truncated or not a results file: the message names it
            bad.append(str(exc))
            warn(f"hpcfl: skipped {f}: {exc}")
        except OSError as exc:      # a read error anywhere in it (failing storage): still only this run's
            bad.append(f"{f} cannot be read ({exc.strerror or exc})")
            warn(f"hpcfl: skipped {f}: it cannot be read ({exc.strerror or exc})")
    if not out:
        raise HpcflError(f"no run could be read: {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                         + "; pass hpcfl results.h5 files, or remove a run killed before it wrote anything")
    return out


# --------------------------------------------------------------------------- grouping

def _ignored(key: str) -> bool:
    return key in IGNORED_KEYS or key.startswith(IGNORED_SECTIONS)


def _hashable(v):
    """A config value as a dict key (lists become JSON text)."""
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def differing_keys(configs: list[dict]) -> list[str]:
    """Dotted keys whose values differ across ``configs``, except replicate and bookkeeping keys.

    A key present in some configs only (e.g. ``algorithm.nova.value`` of FedNova runs beside
    FedAvg ones) differs. Ignored: ``run.name``, ``run.seed``, ``checkpoint.*``,
    ``watchdog.*``, ``results.*`` and the ``runtime`` keys that do not change results.

    Returns
    -------
    list of str, sorted
    """
    return _differing([flatten(c) for c in configs])


def _differing(flat: list[dict]) -> list[str]:
    """:func:`differing_keys` of already flattened configs."""
    keys = set().union(*flat) if flat else set()
    return sorted(k for k in keys if not _ignored(k) and len({_hashable(f.get(k, _MISSING)) for f in flat}) > 1)


def format_value(v) -> str:
    """A config value as it appears in a group label: strings bare, the rest as TOML-ish JSON."""
    if v is _MISSING:
        return "(unset)"
    return v if isinstance(v, str) else json.dumps(v)


def value_matches(v, text: str) -> bool:
    """Whether config value ``v`` is what ``text`` says (``0.1`` == ``0.10``, ``fedavg``, ``true``)."""
    if format_value(v) == text or str(v) == text:
        return True
    try:
        return not isinstance(v, bool) and isinstance(v, (int, float)) and float(v) == float(text)
    except ValueError:
        return False


def _priority(key: str) -> tuple:
    """Order in which keys are tried as label keys: shallow first, component names first."""
    return (key.count("."), not key.endswith(".name"), key)


def _splitting_keys(flat: list[dict], keys: list[str]) -> list[str]:
    """The keys, in priority order, that each split the runs further than those before them.

    A key whose value follows from keys already taken (a preset's slot values follow from
    ``algorithm.name``) adds nothing to the grouping and would only lengthen the labels.
    Keys of one tier (same depth, both component names or both not) are judged against the
    earlier tiers only: keys that change together (``lga.variant``, ``lga.grad_proxy`` and
    ``lga.alpha_min`` of a paper-exact run beside the defaults) are all named, not just the
    first in alphabetical order.
    """
    def parts(cols: list[str]) -> int:
        return len({tuple(_hashable(f.get(c, _MISSING)) for c in cols) for f in flat})

    chosen: list[str] = []
    for _, tier in itertools.groupby(sorted(keys, key=_priority), key=lambda k: _priority(k)[:2]):
        before = list(chosen)
        chosen += [k for k in tier if parts(before + [k]) > parts(before)]
    return sorted(chosen, key=_priority)


def short_names(keys: list[str]) -> dict[str, str]:
    """Each dotted key's leaf (``algorithm.lr`` -> ``lr``), or the whole key where leaves collide."""
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: leaf if leaves.count(leaf) == 1 else k for k, leaf in zip(keys, leaves)}


def resolve_key(key: str, flat: list[dict], preferred: list[str] = ()) -> str:
    """The full dotted key meant by ``key``: itself, or a unique leaf/suffix match.

    ``preferred`` keys (the grouping keys) are tried first, so ``name`` means
    ``algorithm.name`` when that is what the groups differ in.

    Raises
    ------
    HpcflError
        When no run has the key, or a short key matches several.
    """
    every = set().union(*flat) if flat else set()
    if key in every:
        return key
    # the grouping keys, then keys that can change results (``name``: algorithm.name, not run.name)
    for pool in (list(preferred), sorted(k for k in every if not _ignored(k)), sorted(every)):
        hits = [k for k in pool if k.endswith("." + key)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise HpcflError(f"key {key!r} is ambiguous: it could be {', '.join(hits[:6])}; give the full dotted key")
    close = difflib.get_close_matches(key, sorted(every), n=5, cutoff=0.5)
    hint = close or _differing(flat) or sorted(every)
    raise HpcflError(f"no run has the config key {key!r}; existing keys include {', '.join(hint[:6])} "
                     f"(dotted, as in the job file, e.g. algorithm.lr)")


def group_runs(results: list, by: list[str] | None = None, words: bool = True) -> dict[str, list]:
    """Group runs by the values of config keys.

    Parameters
    ----------
    results : list of Results
    by : list of str, optional
        Dotted config keys (a unique leaf such as ``lr`` is accepted). Default: the keys
        that differ across the runs (:func:`differing_keys`); the label then names only
        the keys that split the runs further, in order: shallow keys, ``*.name`` first.
    words : bool
        Label the groups in the legend's words (``FedNova, lr 0.1``: :mod:`.words`) when those
        tell every group apart; else, or with ``words=False``, by keys (``name=fednova, lr=0.1``:
        leaf keys, the dotted key where two leaves collide; :func:`dotted_labels`).

    Returns
    -------
    dict of label -> list of Results
        In order of first appearance; ``"all"`` when nothing differs.
    """
    flat = [flatten(r.config) for r in results]
    keys = _label_keys(flat, by)
    labels = _dotted(flat, keys)
    if words and keys and all("." not in n for n in short_names(keys).values()):   # no two keys share a leaf
        said = [W.group_words(keys, f) for f in flat]
        if len(set(zip(labels, said))) == len(set(labels)) == len(set(said)):   # one-to-one with the groups
            labels = said
    groups: dict[str, list] = {}
    for r, label in zip(results, labels):
        groups.setdefault(label, []).append(r)
    return groups


def _dotted(flat: list[dict], keys: list[str]) -> list[str]:
    names = short_names(keys)
    return [", ".join(f"{names[k]}={format_value(f.get(k, _MISSING))}" for k in keys) or "all" for f in flat]


def dotted_labels(results: list, by: list[str] | None = None) -> dict[str, str]:
    """label of :func:`group_runs` -> the group's label by keys (``name=fednova, lr=0.1``), which
    ``hpcfl report --baseline`` and ``--paper`` accept as well as the words."""
    flat = [flatten(r.config) for r in results]
    dotted = _dotted(flat, _label_keys(flat, by))
    word = {id(r): label for label, members in group_runs(results, by).items() for r in members}
    return {word[id(r)]: d for r, d in zip(results, dotted)}


def group_keys(results: list, by: list[str] | None = None) -> list[str]:
    """The full dotted keys :func:`group_runs` labels its groups with (same arguments)."""
    return _label_keys([flatten(r.config) for r in results], by)


def _label_keys(flat: list[dict], by: list[str] | None) -> list[str]:
    if by is None:
        return _splitting_keys(flat, _differing(flat))
    differing = _differing(flat)   # a short key means the one the runs differ in
    return list(dict.fromkeys(resolve_key(k, flat, preferred=differing) for k in by))


# --------------------------------------------------------------------------- quality curve

def quality(results) -> tuple[str, np.ndarray, np.ndarray]:
    """The run's quality metric over its evaluated rounds.

    Returns
    -------
    kind : str
        ``"accuracy"`` (test accuracy, higher is better) or, for a run with no finite
        accuracy at all (e.g. the quadratic model), ``"loss"`` (test loss, lower is better).
    rounds : np.ndarray of int64, shape (evaluations,)
        1-based round numbers of the evaluated rounds (NaN rows skipped).
    values : np.ndarray of float64, shape (evaluations,)
    """
    m = results.metrics
    rounds = np.asarray(m["round"], dtype=np.int64)
    for kind, name in (("accuracy", "test_accuracy"), ("loss", "test_loss")):
        values = np.asarray(m.get(name, np.full(rounds.shape, np.nan)), dtype=np.float64)
        ok = np.isfinite(values)
        if ok.any() or kind == "loss":
            return kind, rounds[ok], values[ok]
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- per-run summary

@dataclass
class RunStats:
    """One run's summary; NaN where undefined (no evaluation yet, target never reached).

    ``sim_to_target`` is None when the run has no simulated clock (no ``[system]``).
    """

    path: Path
    seed: object
    status: str
    kind: str
    rounds: int
    final: float
    best: float
    best_round: float
    last_k: float
    to_target: float
    sim_to_target: float | None
    # the clients' accuracies at the last evaluated round (/client_eval, .fairness): NaN without it
    client_mean: float = float("nan")
    client_worst10: float = float("nan")
    client_std: float = float("nan")
    client_jain: float = float("nan")

    @property
    def evaluated(self) -> bool:
        return bool(np.isfinite(self.final))


def first_reaching(rounds: np.ndarray, values: np.ndarray, kind: str, target: float) -> float:
    """The first round whose value reaches ``target``, or NaN when none does.

    Reaching is ``>=`` for accuracy and ``<=`` for loss; ``rounds``, ``values`` (evaluations,)
    are the evaluated rounds only (NaN rows already dropped).
    """
    hit = values >= target if kind == "accuracy" else values <= target
    return float(rounds[int(np.argmax(hit))]) if hit.any() else float("nan")


def run_stats(res, path: Path, target: float | None, last_k: int) -> RunStats:
    """Summarise one run (``res``: Results) over its evaluated rounds."""
    kind, rounds, values = quality(res)
    nan = float("nan")
    sim = np.asarray(res.metrics.get("sim_time", np.zeros(0)), dtype=np.float64)
    has_clock = bool(np.any(sim[np.isfinite(sim)] != 0))
    final = best = best_round = mean_k = to_target = nan
    sim_to_target = nan if has_clock else None
    if values.size:
        i = int(np.argmax(values) if kind == "accuracy" else np.argmin(values))   # first best
        final, best, best_round = float(values[-1]), float(values[i]), float(rounds[i])
        mean_k = float(np.mean(values[-last_k:]))
    if target is not None and values.size:
        to_target = first_reaching(rounds, values, kind, target)
        if has_clock and np.isfinite(to_target):
            # sim_time rows are per round; the metrics row of round r is the one with round == r
            sim_to_target = float(sim[np.asarray(res.metrics["round"]) == int(to_target)][0])
    n_rounds = int(res.metrics["round"][-1]) if len(res.metrics["round"]) else 0
    _, fair = final_fairness(getattr(res, "client_eval", {}) or {})
    return RunStats(**{f"client_{k}": v for k, v in fair.items()},
                    path=path, seed=res.config.get("run", {}).get("seed", res.attrs.get("seed")),
                    status=str(res.attrs.get("status", "running")), kind=kind, rounds=n_rounds, final=final,
                    best=best, best_round=best_round, last_k=mean_k, to_target=to_target,
                    sim_to_target=sim_to_target)
