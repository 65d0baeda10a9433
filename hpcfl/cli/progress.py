"""Progress display and the end-of-run summary (rank 0 only)."""

from __future__ import annotations

import math
import os
import shutil
import sys
import textwrap
import time

import numpy as np


class Progress:
    """One concise line per round, or a self-updating bar on a terminal.

    Each round shows the train loss, the test accuracy (the test loss for a model without
    an accuracy, e.g. the quadratic; ``-`` in a round without evaluation), the clients,
    tau for the steps policies that adapt it (GIFT, AdaComm, AFL), the round's seconds,
    and the elapsed time with an estimate of the time left.

    Parameters
    ----------
    rounds : int
    mode : {"auto", "bar", "line", "none"}
        "auto" is "bar" when stdout is a terminal, else "line".
    accuracy : bool
        False for a model without an accuracy: the column is then the test loss in every
        round, evaluated or not.
    start : int
        Rounds already done (a resumed run): the estimate counts only this session's rounds.
    """

    def __init__(self, rounds: int, mode: str = "auto", accuracy: bool = True, start: int = 0):
        self.rounds, self.accuracy, self.start = rounds, accuracy, start
        self.mode = ("bar" if sys.stdout.isatty() else "line") if mode == "auto" else mode
        self.best = float("nan")
        self.t0 = time.perf_counter()
        self.open = False      # a bar line is on screen without its newline
        self.out = sys.stdout
        if self.mode == "bar":   # anything else printed while the bar is open starts on a line of its own
            sys.stdout, sys.stderr = _AfterBar(sys.stdout, self), _AfterBar(sys.stderr, self)

    def update(self, m: dict) -> None:
        if self.mode == "none":
            return
        acc = m["test_accuracy"]
        if not math.isnan(acc):
            self.best = acc if math.isnan(self.best) else max(self.best, acc)
        name, value = ("test_acc", acc) if self.accuracy else ("test_loss", m["test_loss"])
        test = f"{name} {value:.4f}" if not math.isnan(value) else f"{name}   -   "
        r = m["round"]
        elapsed = time.perf_counter() - self.t0
        left = elapsed / max(1, r - self.start) * (self.rounds - r)
        # Fields in the order shown; the bar drops the later ones first when the terminal is narrow.
        fields = [f"round {r:>{len(str(self.rounds))}}/{self.rounds}", test,
                  f"[{clock(elapsed)} elapsed, {clock(left)} left]", f"train_loss {m['train_loss']:.4f}",
                  f"{m['time_round']:.2f} s", *([f"tau {m['tau_used']}"] if "tau_used" in m else []),
                  f"clients {m['clients_participating']}"]
        if self.mode == "bar":
            self.out.write("\r" + fit_bar(fields, r / self.rounds, terminal_width(self.out)) + "\033[K")
            self.open = r != self.rounds
            if not self.open:
                self.out.write("\n")
        else:   # a log file: every field, in the order of the summary's columns
            round_, test, times, train, secs, *rest = fields
            self.out.write("  ".join([round_, train, test, *reversed(rest), secs, times]) + "\n")
        self.out.flush()

    def break_line(self) -> None:
        """End a bar line that is still open, so that a message printed next starts on its own line."""
        if self.open:
            self.out.write("\n")
            self.out.flush()
            self.open = False

    def close(self) -> None:
        self.break_line()
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, _AfterBar) and stream.progress is self:
                setattr(sys, name, stream.stream)
        sys.stdout.flush()


class ShowProgress:
    """The progress display as a callback of a run (:func:`hpcfl.run` puts it first): built at the
    run's start from ``runtime.progress`` (:class:`Progress`), a line or the bar at each round,
    closed at the end."""

    def __init__(self):
        self.progress = None

    def __call__(self, event) -> None:
        if event.kind == "start":
            self.progress = Progress(event.rounds, event.job["runtime"]["progress"], accuracy=event.classifier,
                                     start=event.start_round)
        elif event.kind == "round" and self.progress is not None:
            self.progress.update(event.metrics)
        elif event.kind == "end":
            self.close()

    def close(self) -> None:
        """End the display (at the run's End, or when the run ended without one: the streams come back)."""
        if self.progress is not None:
            self.progress.close()
            self.progress = None


class _AfterBar:
    """A stream that ends the progress bar's open line before anything else is written to it
    (a stop message, a notice of the round loop, a warning)."""

    def __init__(self, stream, progress: Progress):
        self.stream, self.progress = stream, progress

    def write(self, text: str) -> int:
        if text:
            self.progress.break_line()
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


class FitLines:
    """A terminal stream that breaks each finished line wider than the terminal at spaces,
    continuing it indented on the next line.

    A terminal would wrap it anyway, but wherever it wraps, a later ``\\r`` (the progress bar)
    returns only over the last part, and notices and paths wrap mid-word. Text holding a
    ``\\r`` (the bar, already fitted by :func:`fit_bar`) goes through unchanged.
    """

    def __init__(self, stream):
        self.stream, self.pending = stream, ""

    def write(self, text: str) -> int:
        if "\r" in text:
            self.flush()
            return self.stream.write(text)
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.stream.write(fold(line, terminal_width(self.stream)) + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.stream.write(self.pending)
            self.pending = ""
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def fit_to_terminal():
    """Put :class:`FitLines` on stdout and stderr where they are terminals; returns the undo."""
    saved = sys.stdout, sys.stderr
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream.isatty():
            setattr(sys, name, FitLines(stream))

    def undo() -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = saved
    return undo


def fold(line: str, columns: int) -> str:
    """``line`` broken at spaces into pieces shorter than ``columns`` (continuations indented)."""
    if len(line) < columns:
        return line
    return "\n".join(textwrap.wrap(line, max(columns - 1, 8), subsequent_indent="    ", break_on_hyphens=False))


def terminal_width(stream) -> int:
    """Columns of the terminal ``stream`` writes to (re-read every round: windows get resized);
    80 when it cannot be told."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, AttributeError, ValueError):
        return shutil.get_terminal_size((80, 24)).columns


def fit_bar(fields: list[str], done: float, columns: int) -> str:
    """``[#####.....] round 3/30  test_acc 0.8125  ...``: the bar and as many fields as fit.

    The line stays shorter than the terminal (``columns - 1`` at most): a line that fills the
    last column wraps on many terminals, and ``\\r`` then returns only to the wrapped part,
    leaving a trail of old bars. Fields are dropped from the end of ``fields`` first (a
    narrower bar of 10 cells is tried before each drop); with only the first field left, the
    bar goes.
    """
    limit = max(columns - 1, 1)
    for n in range(len(fields), 0, -1):
        for cells in (20, 10) + ((0,) if n == 1 else ()):
            bar = f"[{'#' * int(cells * done)}{'.' * (cells - int(cells * done))}] " if cells else ""
            text = bar + "  ".join(fields[:n])
            if len(text) <= limit:
                return text
    return fields[0][:limit]


def clock(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: a duration at a glance."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def summary_table(history: list[dict], wall: float, path, columns: int | None = None) -> str:
    """The closing table: rounds, final and best test accuracy (the test loss for models
    without an accuracy, e.g. the quadratic), time by phase. ``history`` may be empty (a run that
    diverged in its first round): the table then says that no round was recorded.

    ``columns``: the terminal's width; values too long for it continue on lines of their own
    under the value column, and the rules are no wider than the terminal. None: no limit (a log).
    """
    if not history:
        rows = [("rounds", "0 (none recorded)"), ("wall time", f"{wall:.1f} s"), ("results", str(path))]
        w = max(len(k) for k, _ in rows)
        line = "-" * (w + 3 + max(len(v) for _, v in rows))
        return "\n".join([line] + [f"{k:<{w}} | {v}" for k, v in rows] + [line])
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
    room = max(20, columns - 1 - (w + 3)) if columns else None   # the value column's width
    body = []
    for k, v in rows:
        parts = textwrap.wrap(v, room) if room and len(v) > room else [v]
        body += [f"{k if i == 0 else '':<{w}} | {part}" for i, part in enumerate(parts)]
    line = "-" * max(len(b) for b in body)
    warning = divergence_warning(history)
    if warning and columns:
        warning = "\n".join(textwrap.wrap(warning, columns - 1))
    return "\n".join([line, *body, line] + ([warning] if warning else []))


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
