"""Every refusal of planning, on every rank (2 and 3 ranks, 60 s each): the same input error
(exit 2) everywhere, nothing in ``--out`` changed.

Planning reads ``--out`` on rank 0 only. Before, a refusal there left rank 0 waiting to agree
while the other ranks had gone on into set-up's collectives (the placement's Split_type): two
different collectives, a hang that SIGTERM could not end. Each case below hung for ever then.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job

import hpcfl
from hpcfl.errors import HpcflError

A = job(**{"run.rounds": 4, "checkpoint.every": 2})
B = job(**{"run.rounds": 4, "checkpoint.every": 2, "run.seed": 9, "algorithm.name": "fedprox"})


@pytest.fixture(scope="module")
def base():
    """Rank 0: job B finished in ``b`` (checkpoints 2 and 4)."""
    comm = MPI.COMM_WORLD
    path = Path(comm.bcast(tempfile.mkdtemp(prefix="hpcfl-refusals-") if comm.rank == 0 else None, root=0))
    if comm.rank == 0:
        hpcfl.run(B, out=path / "b", comm=MPI.COMM_SELF)
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def finished_a(out):
    """Job A finished in ``out`` (checkpoints 2 and 4; a copy elsewhere would be another run's)."""
    hpcfl.run(A, out=out, comm=MPI.COMM_SELF)


def other_jobs_results(base, out):
    finished_a(out)
    return B, {}


def other_jobs_checkpoint_newest(base, out):
    finished_a(out)
    shutil.copyfile(base / "b" / "checkpoints" / "ckpt-00000004.h5", out / "checkpoints" / "ckpt-00000004.h5")
    return A, {"run.rounds": 6}      # more rounds: a resume, from the newest checkpoint, which is B's


def checkpoints_without_results(base, out):
    finished_a(out)
    (out / "results.h5").unlink()
    return A, {}


def results_is_a_link(base, out):
    out.mkdir()
    os.symlink(base / "b" / "results.h5", out / "results.h5")
    return A, {}


def checkpoint_dir_is_a_link(base, out):
    out.mkdir()
    os.symlink(base / "b" / "checkpoints", out / "checkpoints")
    return A, {}


def damaged_results(base, out):
    finished_a(out)
    data = (out / "results.h5").read_bytes()
    (out / "results.h5").write_bytes(data[: len(data) // 3])
    return A, {}


def out_is_a_file(base, out):
    out.write_text("not a folder\n")
    return A, {}


CASES = {
    "another job's results.h5": (other_jobs_results, "holds results of a different job"),
    "another job's checkpoint as the newest": (other_jobs_checkpoint_newest, "was written by a different job"),
    "checkpoints without results.h5": (checkpoints_without_results, "holds checkpoints but"),
    "results.h5 a link": (results_is_a_link, "link"),
    "checkpoints/ a link": (checkpoint_dir_is_a_link, "link"),
    "a damaged results.h5": (damaged_results, "results.h5"),
    "--out a file": (out_is_a_file, "--out"),
}


def snapshot(folder: Path) -> dict:
    """Every path under ``folder`` (links as their target's name, files as bytes), but the lock
    file that planning takes (released, and left for the next run to take)."""
    if folder.is_file() or folder.is_symlink():
        return {".": folder.read_bytes() if not folder.is_symlink() else os.readlink(folder)}
    return {str(p.relative_to(folder)): os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*")) if p.name != ".hpcfl-lock"}


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_a_refusal_at_planning_is_exit_2_on_every_rank(base, case):
    comm = MPI.COMM_WORLD
    make, words = CASES[case]
    out = base / case.replace(" ", "_").replace("/", "").replace("'", "")
    table, sets = (make(base, out) if comm.rank == 0 else (None, None))
    table, sets = comm.bcast((table, sets), root=0)
    before = snapshot(out) if comm.rank == 0 else None
    with pytest.raises(HpcflError) as err:
        hpcfl.run(table, out=out, overrides=sets)
    assert err.value.exit_code == 2
    assert words in str(err.value), str(err.value)
    assert len(set(comm.allgather(str(err.value)))) == 1          # one message, every rank
    if comm.rank == 0:
        assert snapshot(out) == before                            # nothing in --out changed
    comm.Barrier()
