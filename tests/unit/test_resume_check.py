"""hpcfl.io.resume_check: results.h5, a checkpoint and run.rounds that disagree are refused with
the rounds and the fix (the end-to-end cases are in tests/e2e/test_resume_rounds.py)."""

from pathlib import Path

import numpy as np
import pytest

from hpcfl.errors import HpcflError
from hpcfl.io.resume_check import check, spans

RES, CKPT = Path("/r/results.h5"), Path("/r/checkpoints/ckpt-00000004.h5")


def test_spans():
    assert spans([1, 2, 3, 6]) == "1-3, 6" and spans([]) == "none" and spans([5, 4, 4]) == "4-5"


def test_whole_files_pass():
    check(RES, CKPT, 4, 6, 6, np.array([1, 2, 3, 4]))
    check(RES, CKPT, 4, 6, 6, np.array([1, 2, 3, 4, 5, 6]))   # rows past the checkpoint: trimmed on resume
    check(RES, CKPT, 4, 4, 6, np.array([1, 2, 3, 4]))         # run.rounds lowered to the checkpoint: done


@pytest.mark.parametrize("rounds,held,missing,fix", [
    ([1, 2], "1-2", "3-4", "remove the checkpoints after round 2"),
    ([1, 2, 3, 6], "1-3, 6", "4", "remove the checkpoints after round 3"),
    ([1, 3, 4], "1, 3-4", "2", "remove the checkpoints after round 1"),
    ([], "none", "1-4", "remove the checkpoints from /r/checkpoints so that the run starts again at round 1"),
])
def test_results_behind_the_checkpoint(rounds, held, missing, fix):
    with pytest.raises(HpcflError) as info:
        check(RES, CKPT, 4, 6, 6, np.array(rounds, dtype=np.int64))
    msg = str(info.value)
    assert f"{RES} holds rounds {held} but checkpoint {CKPT} was written after round 4" in msg
    assert f"rounds {missing} are missing" in msg and fix in msg and "--force" in msg


def test_rounds_lowered_below_the_checkpoint():
    with pytest.raises(HpcflError) as info:
        check(RES, CKPT, 4, 2, 6, np.array([1, 2, 3, 4]))
    assert str(info.value).startswith(f"run.rounds = 2 is below the round of checkpoint {CKPT} (written after "
                                      f"round 4; its job has run.rounds = 6)")
    assert "--set run.rounds=6" in str(info.value)


@pytest.mark.parametrize("ckpt_job_rounds", [6, None])
def test_a_checkpoint_past_its_own_job(ckpt_job_rounds):
    with pytest.raises(HpcflError) as info:
        check(RES, CKPT.with_name("ckpt-00000099.h5"), 99, 6, ckpt_job_rounds, np.arange(1, 7))
    assert "claims round 99, beyond the job's run.rounds = 6" in str(info.value)
    assert "Remove it from /r/checkpoints" in str(info.value)


def test_rounds_lowered_below_a_finished_runs_last_checkpoint():
    # The checkpoint written after the job's last round (round 6 of 6) is the run's own: lowering
    # run.rounds below it is the "already past" case with its --set fix, not a foreign checkpoint.
    last = CKPT.with_name("ckpt-00000006.h5")
    with pytest.raises(HpcflError) as info:
        check(RES, last, 6, 4, 6, np.arange(1, 7))
    assert str(info.value).startswith(f"run.rounds = 4 is below the round of checkpoint {last} (written after "
                                      f"round 6; its job has run.rounds = 6)")
    assert "--set run.rounds=6" in str(info.value) and "claims round" not in str(info.value)
    with pytest.raises(HpcflError, match="claims round 7, beyond the job's run.rounds = 6"):
        check(RES, CKPT.with_name("ckpt-00000007.h5"), 7, 4, 6, np.arange(1, 8))   # one past its job's end
