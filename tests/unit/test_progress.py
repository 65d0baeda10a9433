"""The console: one line per round and the closing summary, in the file's round numbers."""

import math

from hpcfl.progress import Progress, summary_table

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


def test_progress_line_counts_from_one_and_shows_loss_without_accuracy(capsys):
    p = Progress(10, "line")
    for m in rows([NAN, 0.5], [2.5, 1.25]):
        p.update(m)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("round  1/10") and "test_loss 2.5000" in out[0]
    assert out[1].startswith("round  2/10") and "test_acc 0.5000" in out[1]
