"""The watchdog and checkpoints (hpcfl.engine.watchdog): a checkpoint is timed apart from its round,
so ordinary phases keep the limits of ordinary rounds after a checkpoint of any size; a checkpoint's
own limit follows the state it writes; a state whose save would outlast the Slurm templates' signal
margin is said at start.

Save times are those measured through rank 0 on 2 ranks: 2 GB in 12.7 s, 4 GB in 31.7 s, slower
per byte as the state grows; at that trend a first checkpoint of 45-75 GB reached the old fixed 600 s.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job
from test_watchdog import dog

import hpcfl
from hpcfl.engine import control, watchdog
from hpcfl.engine.watchdog import ALLOWANCE_RATE, SAVE_RATE, checkpoint_note
from hpcfl.io.checkpoint import CheckpointStore

GB = 1e9


def run_round(w, clock, rnd, seconds=1.0, kinds=("decide", "train", "reduce", "server", "record")):
    for k in kinds:
        w.enter(k, rnd)
        clock.t += seconds / len(kinds)


def checkpoint(w, clock, rnd, nbytes, seconds):
    """Round ``rnd``'s checkpoint of ``nbytes``, ``seconds`` long, ticked every second: never ended."""
    w.enter("checkpoint", rnd)
    w.expect_checkpoint(nbytes)   # the job tells it the size once in the phase (a bcast from rank 0)
    for _ in range(int(seconds)):
        clock.t += 1.0
        assert w.tick(1.0) is None
    clock.t += seconds - int(seconds)


def noticed_after(w, clock):
    """Seconds until a rank frozen in the current phase is found, ticking every second (at most 10 min)."""
    for s in range(1, 601):
        clock.t += 1.0
        if w.tick(1.0) is not None:
            return s
    return None


def test_a_frozen_rank_is_noticed_within_90_s_after_a_2_GB_checkpoint():
    w, clock = dog()
    for rnd in range(3):
        run_round(w, clock, rnd)                               # rounds of 1 s
    checkpoint(w, clock, 2, 2 * GB, 12.7)                      # the measured save of 2 GB
    run_round(w, clock, 3)
    assert abs(w.slowest - 1.0) < 1e-9 and abs(w.slowest_checkpoint - 12.7) < 1e-9
    w.enter("reduce", 4)                                       # a peer froze in round 5
    assert w.limit() == 60.0                                   # the floor: 10 x 1 s rounds, not 10 x 13.7 s
    assert noticed_after(w, clock) == 61                       # well within 90 s


def test_a_60_GB_first_checkpoint_of_750_s_is_not_ended_and_the_next_round_is_still_watched_at_the_floor():
    w, clock = dog()
    run_round(w, clock, 0)
    w.enter("checkpoint", 0)
    assert w.limit() == 600.0                                  # size not told yet: startup_s
    checkpoint(w, clock, 0, 60 * GB, 750.0)                    # slower than 4 GB's rate: a fixed 600 s ended it
    assert w.limit() == 60 * GB / ALLOWANCE_RATE == 3000.0     # 60 GB at 20 MB/s
    clock.t += 1500.0                                          # even 3 x that passes
    assert w.tick(1.0) is None
    w.enter("decide", 1)
    w.enter("train", 1)
    assert w.limit() == 60.0 and noticed_after(w, clock) == 61


def test_a_checkpoints_own_limit_follows_its_size_and_the_checkpoints_before():
    w, clock = dog()
    run_round(w, clock, 0)
    checkpoint(w, clock, 0, 1 * GB, 5.1)
    assert w.limit() == 600.0                                  # first checkpoint, 1 GB = 50 s: startup_s
    run_round(w, clock, 1)
    checkpoint(w, clock, 1, 1 * GB, 5.1)
    assert abs(w.limit() - 60.0) < 1e-9                        # max(floor, 10 x 5.1 s, 50 s): no startup_s any more
    run_round(w, clock, 2)
    checkpoint(w, clock, 2, 200 * GB, 0.0)                     # the state grew: 200 GB = 10,000 s
    assert w.limit() == 10000.0
    w.enter("record", 3)
    w.enter("checkpoint", 3)                                   # a slow one before (80 s) sets the base
    w.slowest_checkpoint, w.checkpoint_bytes = 80.0, 0
    assert w.limit() == 800.0


def test_time_spent_checkpointing_is_left_out_of_the_rounds_share_and_of_the_final_write():
    w, clock = dog()
    run_round(w, clock, 0, 2.0)
    run_round(w, clock, 1, 2.0)
    checkpoint(w, clock, 1, 10 * GB, 100.0)
    w.enter("final", 1)                                        # the job's last phase, in the last round
    assert w.round_checkpoint == pytest.approx(100.0) and w.since - w.round_start == pytest.approx(102.0)
    w.finished.add("final")                                    # as if a final write had finished before
    assert w.limit() == pytest.approx(60.0)                    # 10 x 2 s of the round's own work, not 10 x 102 s


def test_the_message_in_a_checkpoint_names_its_own_terms():
    w, clock = dog()
    run_round(w, clock, 0)
    checkpoint(w, clock, 0, 2 * GB, 12.7)
    run_round(w, clock, 1)
    w.enter("checkpoint", 1)
    w.expect_checkpoint(3 * GB)
    msg = w.message(200.0, w.limit())
    assert msg.startswith(
        "hpcfl watchdog: rank 1 stuck in phase 'checkpoint' of round 2 for 200 s (limit 150 s, derived: "
        "max(watchdog.floor_s = 60, watchdog.factor = 10 x the slowest checkpoint (12.7 s), 3 GB of state at "
        "20 MB/s), at least watchdog.startup_s = 600 in a first checkpoint). A rank")


@pytest.mark.parametrize("nbytes, said", [(1 * GB, False), (300 * SAVE_RATE, False), (300 * SAVE_RATE + 1, True),
                                          (60 * GB, True)])
def test_the_start_note_only_for_a_state_whose_save_outlasts_the_300_s_signal_margin(nbytes, said):
    note = checkpoint_note(int(nbytes))
    assert (note is not None) == said
    if said and nbytes == 60 * GB:
        assert note.startswith("a checkpoint of this run's state (60 GB) takes about 480 s through rank 0 "
                               "(at 125 MB/s), longer than the 300 s the Slurm templates leave")
        assert "#SBATCH --signal=B:USR1@300; assumed" in note
        assert "Raise the margin in the template's --signal line to at least 960 s, or checkpoint less state" in note


def test_a_run_tells_the_watchdog_each_checkpoints_exact_size_and_notes_a_big_one(tmp_path, monkeypatch, capsys):
    told = []
    monkeypatch.setattr(control.RunControl, "expect_checkpoint", lambda self, n: told.append(n))
    monkeypatch.setattr(watchdog, "SAVE_RATE", 1.0)            # 1 B/s: this small state outlasts the margin
    table = job(**{"algorithm.name": "scaffold", "run.rounds": 2, "checkpoint.every": 1})
    hpcfl.run(table, out=tmp_path / "r")
    store = CheckpointStore(tmp_path / "r" / "checkpoints")
    loaded = store.load_latest()
    size = sum(np.asarray(a).nbytes for a in loaded.arrays.values())
    assert len(told) == 2 and told[-1] == size                 # the model, SCAFFOLD's c and every client's c_i
    assert size > 7 * 1210 * 4                                 # the 7 clients' table is in it
    out = capsys.readouterr().out
    assert f"hpcfl: note: a checkpoint of this run's state ({size / 1e9:.3g} GB) takes about {size:.0f} s" in out


def test_the_state_size_counts_every_ranks_rows_the_model_and_the_servers_arrays(monkeypatch):
    """Rank 0 of 2 holds 2 of 5 clients' rows: a (5, 3) float64 table is 120 bytes (its dtype from
    rows(), as resume._dtype takes it), a float32 (5, 2) one 40, the server's 2 float64 16 (one not started yet: 0), the float32 model of 4 values 16."""
    from types import SimpleNamespace

    import torch

    from hpcfl.engine import resume, staterows
    from hpcfl.state import ClientTable, ServerArray

    def on_device():   # a RowTable's get() copies a GPU table to the host: the size must not need it
        raise AssertionError("get() of a table that gives rows()")

    b = np.zeros((2, 2), dtype=np.float32)
    items = [ClientTable("a", 3, get=on_device, set=None, rows=lambda slots: np.zeros((len(slots), 3))),
             ClientTable("b", 2, get=lambda: b, set=None),
             ServerArray("g", get=lambda: np.zeros(2), set=None), ServerArray("h", get=lambda: None, set=None)]
    for where in (resume, staterows):   # resume's own code and the rows' helpers
        monkeypatch.setattr(where, "state_items", lambda s: items)
    s = SimpleNamespace(owner=np.array([0, 1, 1, 0, 1]), model=SimpleNamespace(length=4, flat=torch.zeros(4)))
    assert resume.state_bytes(s) == 120 + 40 + 16 + 16


def test_run_control_passes_the_size_to_its_watchdog():
    class One:
        rank, size = 0, 1

    rc = control.RunControl(One(), None, 0.0)
    rc.expect_checkpoint(123_000_000)
    assert rc.watchdog.checkpoint_bytes == 123_000_000 and rc.watchdog.checkpoint_allowance() == 6.15
    rc.close()


def test_before_any_round_or_checkpoint_finished_a_kind_seen_before_still_gets_startup_s():
    """The allowance holds while there is no history of the phase's own sort (rounds, or checkpoints),
    even for a kind that has ended once already in this first round."""
    w, clock = dog()
    w.enter("train", 0)
    clock.t += 1.0
    w.enter("reduce", 0)
    w.enter("train", 0)                                        # "train" has finished once, no round has
    assert w.limit() == 600.0
