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
    return "\n".join([line] + [f"{k:<{w}} | {v}" for k, v in rows] + [line])
