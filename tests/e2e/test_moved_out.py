"""--out moved (or replaced by another folder) while the run writes, its checkpoints elsewhere: the
open results.h5 moved with its folder, and the run finishes it there, saying so. Before, the final
write looked for results.h5 at the old path: a traceback (exit 1), the moved file left "running"."""

import os
from pathlib import Path

import h5py

import hpcfl
from hpcfl.results import load


def job(ckpts: Path) -> dict:
    return {"run": {"name": "mv", "seed": 3, "rounds": 4}, "data": {"dataset": "digits", "num_clients": 6},
            "model": {"name": "mlp", "mlp": {"hidden": [16]}}, "runtime": {"threads": 1, "progress": "none"},
            "checkpoint": {"dir": str(ckpts), "every": 1}}


def test_a_run_whose_out_is_moved_mid_run_finishes_its_results_where_they_went(tmp_path, capsys):
    out, moved = tmp_path / "out", tmp_path / "moved"

    def swap(event):
        if event.kind == "round" and event.round == 2:
            os.rename(out, moved)
            out.mkdir()                                  # another folder in its place

    res = hpcfl.run(job(tmp_path / "ckpts"), out=out, callbacks=[swap])
    assert res.status == "finished" and Path(res.source) == moved / "results.h5"
    assert res.metrics["round"].tolist() == [1, 2, 3, 4]
    assert f"{out} was moved while the run wrote it; its results.h5 was finished where it is now, in {moved}" \
        in capsys.readouterr().out
    with h5py.File(moved / "results.h5", "r") as f:
        assert f.attrs["status"] == b"finished" and "final" in f   # fixed-size bytes (schema 3)
    assert list(out.iterdir()) == []                     # nothing written into the folder put in its place
    ref = hpcfl.run(job(tmp_path / "ckpts-ref"), out=tmp_path / "ref")
    assert load(moved).final_params.tobytes() == ref.final_params.tobytes()   # the same run, bitwise
