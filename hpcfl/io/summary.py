"""What ``print(hpcfl.results.load(run))`` shows: a few lines about a run, not every array."""

from __future__ import annotations

import numpy as np

FIRST = ("train_loss", "test_accuracy", "test_loss", "steps", "weight")   # named first in the summary


def _names(d: dict, limit: int = 6) -> str:
    names = sorted((k for k in d if k not in ("round", "client")), key=lambda k: (k not in FIRST, FIRST.index(k)
                                                                                 if k in FIRST else 0, k))
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


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
    n_rows = len(next(iter(res.clients.values()), ()))
    lines += [f"  .metrics: {len(res.metrics)} per-round arrays ({_names(res.metrics)})",
              f"  .clients: {len(res.clients)} arrays of {n_rows} rows, one per cohort member and round "
              f"({_names(res.clients)})",
              "  also .config, .attrs, .segments, .class_counts"
              + (", .model(), .state_dict()" if res.final_params is not None else "")]
    return "\n".join(lines)
