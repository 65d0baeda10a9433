"""What ``print(hpcfl.results.load(run))`` shows: a few lines about a run, not every array."""

from __future__ import annotations

import numpy as np

FIRST = ("train_loss", "test_accuracy", "test_loss", "steps", "weight")   # named first in the summary


def _names(d: dict, limit: int = 6) -> str:
    """The arrays of ``d`` by name, the keys first (round, client), then at most ``limit`` others and
    how many more: every array is counted once, as the line's total counts them."""
    keys = [k for k in ("round", "client") if k in d]
    names = sorted((k for k in d if k not in keys), key=lambda k: (k not in FIRST, FIRST.index(k)
                                                                   if k in FIRST else 0, k))
    more = len(names) - limit
    return ", ".join(keys + names[:limit]) + (f" and {more} more" if more > 0 else "")


def _rows(table) -> int:
    """Rows of a table of columns, without reading a lazily read one (hpcfl.io.reader.Columns)."""
    rows = getattr(table, "rows", None)
    return rows if rows is not None else len(next(iter(table.values()), ()))


def summary(res) -> str:
    """What ``repr(load(run))`` prints: the job in one line, how far it got, its quality, what it holds.

    ``res`` is a :class:`hpcfl.io.reader.Results` (not imported here: the reader imports this module).
    """
    cfg, attrs = res.config, res.attrs
    run, data, alg = cfg.get("run", {}), cfg.get("data", {}), cfg.get("algorithm", {})
    rounds = np.asarray(res.metrics.get("round", ()))
    done = int(rounds[-1]) if rounds.size else 0
    lines = [f"Results of run {run.get('name', '?')!r} (seed {run.get('seed', '?')}): {alg.get('name', '?')} on "
             f"{data.get('dataset', '?')} ({data.get('partition', '?')}), {data.get('num_clients', '?')} clients, "
             f"model {cfg.get('model', {}).get('name', '?')}, {attrs.get('world_size', '?')} rank(s)",
             f"  {attrs.get('status', 'running')}: {done} of {run.get('rounds', '?')} rounds"]
    for name, word, best in (("test_accuracy", "test accuracy", np.nanargmax),
                             ("test_loss", "test loss", np.nanargmin)):
        v = np.asarray(res.metrics.get(name, ()), dtype=np.float64)
        if np.isfinite(v).any():
            ok = np.flatnonzero(np.isfinite(v))
            i = int(best(v))
            lines.append(f"  final {word} {v[ok[-1]]:.4f} (round {int(rounds[ok[-1]])}), best {v[i]:.4f} "
                         f"(round {int(rounds[i])})")
            break
    n_rows = _rows(res.clients)
    kept = str(res.attrs.get("clients_recorded", "all"))
    panel = getattr(res, "panel", None)
    whose = (f"one per cohort member of the panel and round ({len(panel) if panel is not None else '?'} of "
             f"{len(res.class_counts) if res.class_counts is not None else '?'} clients, .panel; "
             f"results.clients = \"sampled\")") if kept == "sampled" else "one per cohort member and round"
    lines += [f"  .metrics: {len(res.metrics)} per-round arrays ({_names(res.metrics)})",
              f"  .clients: {len(res.clients)} arrays of {n_rows} rows, {whose} "
              f"({_names(res.clients)})" + (' (results.clients = "none": none kept)' if kept == "none" else ""),
              *([f"  .client_eval: {len(res.client_eval)} arrays of {_rows(res.client_eval)} rows, one per "
                 f"client and evaluated round ({_names(res.client_eval)})"] if getattr(res, "client_eval", None)
                else []),
              "  also .config, .attrs, .segments, .class_counts, .to_pandas()"
              + (", .model(), .state_dict()" if res.final_params is not None else "")]
    return "\n".join(lines)
