"""The console: one line per round and the closing summary, in the file's round numbers."""

import math
import sys

from hpcfl.cli.progress import Progress, clock, divergence_warning, fit_bar, summary_table

NAN = math.nan


def rows(acc, loss):
    return [{"round": r, "test_accuracy": a, "test_loss": l, "train_loss": 1.0 / r, "clients_participating": 3,
             "time_round": 0.5, "time_train": 0.25} for r, (a, l) in enumerate(zip(acc, loss), start=1)]


def test_summary_names_the_best_round_as_the_file_numbers_it():
    text = summary_table(rows([NAN, 0.5, NAN, 0.75, 0.625], [NAN, 1.0, NAN, 0.5, 0.75]), 3.0, "r.h5")
    assert "final test accuracy | 0.6250" in text and "best test accuracy  | 0.7500 (round 4)" in text
    assert "final train loss    | 0.2000" in text and "rounds              | 5" in text


def test_summary_shows_the_test_loss_when_the_model_has_no_accuracy():
    text = summary_table(rows([NAN] * 4, [3.0, 2.0, 0.5, 1.0]), 1.0, "r.h5")
    assert "final test loss" in text and "| 1.0000" in text
    assert "best test loss" in text and "0.5000 (round 3)" in text
    assert "n/a" not in text and "accuracy" not in text


def test_progress_line_counts_from_one_and_keeps_its_column_label(capsys):
    """The column is the test accuracy in every round (``-`` before the first evaluation), or
    for a model without an accuracy the test loss in every round: never one, then the other."""
    p = Progress(10, "line")
    for m in rows([NAN, 0.5], [2.5, 1.25]):
        p.update(m)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("round  1/10") and "test_acc   -   " in out[0] and "test_loss" not in out[0]
    assert out[1].startswith("round  2/10") and "test_acc 0.5000" in out[1]
    p = Progress(10, "line", accuracy=False)
    for m in rows([NAN, NAN, NAN], [NAN, 2.5, 1.25]):
        p.update(m)
    out = capsys.readouterr().out.splitlines()
    assert ["test_loss   -   " in out[0], "test_loss 2.5000" in out[1], "test_loss 1.2500" in out[2]] == [True] * 3
    assert not any("test_acc" in line for line in out)


def test_progress_line_shows_tau_elapsed_and_time_left(capsys, monkeypatch):
    """Rounds 4 and 5 of 10 after a resume at round 3: the clock reads 0, 4 and 10 s, so round
    4 has taken 4 s for 1 round (6 left: 24 s) and round 5 10 s for 2 (5 left: 25 s)."""
    now = iter([0.0, 4.0, 10.0])
    monkeypatch.setattr("hpcfl.cli.progress.time.perf_counter", lambda: next(now))
    p = Progress(10, "line", start=3)
    for r in (4, 5):
        p.update({**rows([0.5], [1.0])[0], "round": r, "tau_used": 12})
    out = capsys.readouterr().out.splitlines()
    assert "clients 3  tau 12  0.50 s  [4s elapsed, 24s left]" in out[0]
    assert out[1].endswith("[10s elapsed, 25s left]")


def test_clock_reads_at_a_glance():
    assert [clock(s) for s in (0.4, 59.4, 60, 185, 3600, 7625)] == ["0s", "59s", "1m00s", "3m05s", "1h00m", "2h07m"]


def test_a_message_during_the_bar_starts_on_its_own_line(capsys):
    """A stop message (stderr) or a notice (stdout) while the bar is open must not be glued
    to it: the first write after a bar update ends the bar's line."""
    p = Progress(10, "bar")
    p.update(rows([0.5], [1.0])[0])
    print("hpcfl: stopped by SIGINT after round 1", file=sys.stderr)
    p.update({**rows([0.5], [1.0])[0], "round": 2})
    print("hpcfl: note")
    p.close()
    cap = capsys.readouterr()
    assert cap.err == "hpcfl: stopped by SIGINT after round 1\n"
    bars = cap.out.split("\n")
    assert bars[0].startswith("\r[##......") and bars[1].startswith("\r[####....") and bars[2] == "hpcfl: note"
    assert sys.stdout is not None and type(sys.stdout).__name__ != "_AfterBar"   # close() gave the streams back


def losses(train, global_=None):
    """Rows with the given per-round train_loss (and global_train_loss), rounds from 1."""
    global_ = global_ or [NAN] * len(train)
    return [{"round": r, "test_accuracy": 0.5, "test_loss": 1.0, "train_loss": t, "global_train_loss": g,
             "clients_participating": 3, "time_round": 0.5} for r, (t, g) in enumerate(zip(train, global_), 1)]


def test_divergence_warning_fires_at_ten_fold_growth_of_the_3_round_mean():
    """3-round means of the cohort's train loss: 0.8333 (rounds 1-3), 0.5 (2-4), 2 (3-5), 3.5 (4-6),
    5 (5-7). 5 / 0.5 = 10.0 exactly (sums of equal halves and fives are exact in binary), and 5
    is above the first mean, so the warning names both windows and values."""
    warning = divergence_warning(losses([1.5, 0.5, 0.5, 0.5, 5.0, 5.0, 5.0]))
    assert warning == ("warning: train loss (3-round mean) grew 10.0x, from 0.5 (rounds 2-4) to 5 (rounds 5-7): "
                       "the run may be diverging; try a smaller algorithm.lr")


def test_divergence_warning_silent_at_nine_fold_growth():
    """Means 0.5 (rounds 2-4) then 4.5 (rounds 5-7): 9x < 10x, so neither the function nor the
    summary warns."""
    history = losses([1.5, 0.5, 0.5, 0.5, 4.5, 4.5, 4.5])
    assert divergence_warning(history) is None
    assert "warning" not in summary_table(history, 1.0, "r.h5")


def test_one_easy_cohort_is_not_a_ten_fold_growth():
    """Round 2's cohort at 0.06 and round 6's at 1.2 are 20x apart (and 1.2 is above round 1's
    0.9), the noise of partial participation; the 3-round means 0.62, 0.62, 0.9, 1.0 grow 1.6x."""
    assert divergence_warning(losses([0.9, 0.06, 0.9, 0.9, 0.9, 1.2])) is None


def test_divergence_warning_reads_f_of_x_when_evaluated_and_ends_the_summary():
    """With global_train_loss in two or more rounds (NaN rounds skipped: eval_every) that is the
    loss watched, round by round: 10.086 / 0.82 = 12.3x from round 2 to round 5, while the flat
    train_loss (0.5 throughout) would not fire. The warning is the summary's last line."""
    history = losses([0.5] * 5, [1.5, 0.82, NAN, 3.0, 10.086])
    text = summary_table(history, 1.0, "r.h5")
    assert text.splitlines()[-1] == ("warning: F(x) on train data grew 12.3x, from 0.82 (round 2) to 10.09 "
                                     "(round 5): the run may be diverging; try a smaller algorithm.lr")


def test_divergence_warning_silent_for_a_converged_run_jittering_at_small_loss():
    """F(x) going 1e-4 -> 1e-3 is 10x, but 1e-3 stays far below the first value 2.3: converged."""
    assert divergence_warning(losses([0.5] * 4, [2.3, 0.1, 1e-4, 1e-3])) is None


def test_the_bar_drops_fields_from_the_end_to_fit_the_terminal():
    fields = ["round  3/30", "test_acc 0.8125", "[1s elapsed, 9s left]", "train_loss 0.4000", "0.10 s", "clients 10"]
    bar = "[##..................] "
    assert fit_bar(fields, 0.1, 200) == bar + "  ".join(fields)
    assert fit_bar(fields, 0.1, 80) == bar + "round  3/30  test_acc 0.8125  [1s elapsed, 9s left]"   # 74 columns
    assert fit_bar(fields, 0.1, 74) == "[#.........] round  3/30  test_acc 0.8125  [1s elapsed, 9s left]"
    assert fit_bar(fields, 0.1, 40) == bar + "round  3/30"
    assert fit_bar(fields, 0.1, 30) == "[#.........] round  3/30"
    assert fit_bar(fields, 0.1, 12) == "round  3/30"
    assert fit_bar(fields, 0.1, 8) == "round  "


def test_the_summary_fits_the_terminal():
    history = [{**rows([0.5], [1.0])[0], **{f"time_{k}": 0.125 for k in ("decide", "reduce", "server", "eval")}}]
    wide = summary_table(history, 3.0, "runs/quickstart/results.h5")
    assert max(map(len, wide.splitlines())) > 79   # the phase times make a long row
    narrow = summary_table(history, 3.0, "runs/quickstart/results.h5", columns=80)
    assert max(map(len, narrow.splitlines())) <= 79
    assert narrow.replace("\n                    | ", " ").count("eval 0.125)") == 1
