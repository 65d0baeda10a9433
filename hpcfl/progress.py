"""Progress display and the end-of-run summary (rank 0 only)."""

from __future__ import annotations

import math
import sys

import numpy as np


class Progress:
    """One concise line per round, or a self-updating bar on a terminal.

    Parameters
    ----------
    rounds : int
    mode : {"auto", "bar", "line", "none"}
        "auto" is "bar" when stdout is a terminal, else "line".
    """

    def __init__(self, rounds: int, mode: str = "auto"):
        self.rounds = rounds
        self.mode = ("bar" if sys.stdout.isatty() else "line") if mode == "auto" else mode
        self.best = float("nan")

    def update(self, m: dict) -> None:
        if self.mode == "none":
            return
        acc = m["test_accuracy"]
        if not math.isnan(acc):
            self.best = acc if math.isnan(self.best) else max(self.best, acc)
        acc_s = f"{acc:.4f}" if not math.isnan(acc) else "  -   "
        if math.isnan(acc) and not math.isnan(m["test_loss"]):   # a model without accuracy
            test = f"test_loss {m['test_loss']:.4f}"
        else:
            test = f"test_acc {acc_s}"
        r = m["round"]
        text = (f"round {r:>{len(str(self.rounds))}}/{self.rounds}  train_loss {m['train_loss']:.4f}  "
                f"{test}  clients {m['clients_participating']}  {m['time_round']:.2f} s")
        if self.mode == "bar":
            width = 20
            filled = int(width * r / self.rounds)
            sys.stdout.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}")
            if r == self.rounds:
                sys.stdout.write("\n")
        else:
            sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        sys.stdout.flush()


def summary_table(history: list[dict], wall: float, path) -> str:
    """The closing table: rounds, final and best test accuracy (the test loss for models
    without an accuracy, e.g. the quadratic), time by phase."""
    acc = np.array([h["test_accuracy"] for h in history], dtype=np.float64)
    loss = np.array([h["test_loss"] for h in history], dtype=np.float64)
    rounds = [h["round"] for h in history]
    phases = ("decide", "train", "reduce", "server", "eval", "round")
    phase = {k: np.mean([h.get(f"time_{k}", 0.0) for h in history]) for k in phases}
    if np.isfinite(acc).any():
        kind, values, best_i = "accuracy", acc, int(np.nanargmax(acc))
    elif np.isfinite(loss).any():
        kind, values, best_i = "loss", loss, int(np.nanargmin(loss))
    else:
        kind, values, best_i = "accuracy", acc, -1
    evaluated = np.isfinite(values)
    rows = [
        ("rounds", f"{len(history)}"),
        (f"final test {kind}", f"{values[evaluated][-1]:.4f}" if evaluated.any() else "n/a"),
        (f"best test {kind}", f"{values[best_i]:.4f} (round {rounds[best_i]})" if best_i >= 0 else "n/a"),
        ("final train loss", f"{history[-1]['train_loss']:.4f} (clients' mean local mini-batch loss)"),
        ("seconds per round", f"{phase['round']:.3f} (decide {phase['decide']:.3f}, train {phase['train']:.3f}, "
                              f"reduce {phase['reduce']:.3f}, server {phase['server']:.3f}, eval {phase['eval']:.3f})"),
        ("wall time", f"{wall:.1f} s"),
        ("results", str(path)),
    ]
    gtl = [h.get("global_train_loss", float("nan")) for h in history]
    if not np.isnan(gtl[-1]):
        rows.insert(4, ("final F(x) on train data", f"{gtl[-1]:.4f} (run.eval_train)"))
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 3 + max(len(v) for _, v in rows))
    warning = divergence_warning(history)
    return "\n".join([line] + [f"{k:<{w}} | {v}" for k, v in rows] + [line] + ([warning] if warning else []))


GROWTH = 10.0   # a training loss this many times its smallest earlier value is flagged
WINDOW = 3      # rounds averaged in the cohort's train loss before the comparison


def divergence_warning(history: list[dict]) -> str | None:
    """A warning line when the training loss grew ``GROWTH``-fold or more over the run, else None.

    The loss is F(x) on the clients' training data (``global_train_loss``) when the run
    evaluated it in at least two rounds, else the cohort's mean local loss (``train_loss``)
    averaged over ``WINDOW`` consecutive rounds: under partial participation each round has
    other clients, and one cohort of easy clients can sit 10x below the next in a healthy run
    (FedAvg and FedNova on jobs/papers/fednova_synthetic.toml: up to 16x round to round, under
    6x over 3-round means). Rounds without a finite value are skipped. The largest ratio of a
    value to the smallest value before it is reported, with the rounds of both.

    It fires only when that value also exceeds the first one: a loss that climbs back above
    where the run started is going the wrong way, while a converged run whose loss jitters
    between 1e-4 and 1e-3 (the same ratio) is not diverging.
    """
    points = [(h["round"], h.get("global_train_loss", math.nan)) for h in history]
    points = [(r, float(v)) for r, v in points if math.isfinite(v)]
    if len(points) >= 2:
        name, series = "F(x) on train data", [(f"round {r}", v) for r, v in points]
    else:
        points = [(h["round"], float(h["train_loss"])) for h in history if math.isfinite(h["train_loss"])]
        name, series = f"train loss ({WINDOW}-round mean)", [
            (f"rounds {points[i - WINDOW + 1][0]}-{points[i][0]}",
             sum(v for _, v in points[i - WINDOW + 1 : i + 1]) / WINDOW) for i in range(WINDOW - 1, len(points))]
    best = None                        # (ratio, low label, low value, high label, high value)
    low_at, low = None, math.inf
    for at, v in series:
        if low_at is not None and low > 0 and (best is None or v / low > best[0]):
            best = (v / low, low_at, low, at, v)
        if v < low:
            low_at, low = at, v
    if best is None or best[0] < GROWTH or best[4] <= series[0][1]:
        return None
    ratio, at0, v0, at1, v1 = best
    return (f"warning: {name} grew {ratio:.1f}x, from {v0:.4g} ({at0}) to {v1:.4g} ({at1}): the run may be "
            f"diverging; try a smaller algorithm.lr")
