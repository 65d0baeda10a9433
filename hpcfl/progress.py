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
        r = m["round"] + 1
        text = (f"round {r:>{len(str(self.rounds))}}/{self.rounds}  train_loss {m['train_loss']:.4f}  "
                f"test_acc {acc_s}  clients {m['clients_participating']}  {m['time_round']:.2f} s")
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
    """The closing table: rounds, final and best test accuracy, time by phase."""
    acc = np.array([h["test_accuracy"] for h in history], dtype=np.float64)
    evaluated = ~np.isnan(acc)
    best_i = int(np.nanargmax(acc)) if evaluated.any() else -1
    phases = ("decide", "train", "reduce", "server", "eval", "round")
    phase = {k: np.mean([h.get(f"time_{k}", 0.0) for h in history]) for k in phases}
    rows = [
        ("rounds", f"{len(history)}"),
        ("final test accuracy", f"{acc[evaluated][-1]:.4f}" if evaluated.any() else "n/a"),
        ("best test accuracy", f"{acc[best_i]:.4f} (round {best_i + 1})" if best_i >= 0 else "n/a"),
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
