"""Code of your own on the world's ranks (run at 2 and 3): a plug-in model (a CNN; an MLP with
options, one-by-one and in vectorised groups) and a plug-in dataset with a plug-in partition give,
on every rank, the results of a one-rank run of the same job file computed in-process, bitwise."""

import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from plugin_code import DATA, MODELS, job_text, write_module

import hpcfl

CASES = {   # (model, dataset, partition, tables, --set)
    "cnn": ("NETS:SmallCNN", "digits", "iid", "[model.SmallCNN]\nchannels = 3\n", []),
    "mlp_options": ("NETS:mlp", "digits", "dirichlet", "[model.mlp]\nhidden = [8, 6]\nact = \"tanh\"\n", []),
    "mlp_vectorised": ("NETS:mlp", "digits", "iid", "[model.mlp]\nhidden = [8]\n", ["runtime.vectorize=on"]),
    "own_data_and_split": ("NETS:mlp", "DATA:load", "DATA:split", "[model.mlp]\nhidden = [4]\n[data.split]\n"
                                                                  "offset = 2\n", []),
}


@pytest.fixture(scope="module")
def folder():
    comm = MPI.COMM_WORLD
    names = None
    if comm.rank == 0:
        d = Path(tempfile.mkdtemp(prefix="hpcfl-plugins-mpi-"))
        names = (str(d), write_module(d, MODELS, "nets"), write_module(d, DATA, "mydata"))
    names = comm.bcast(names, root=0)
    yield names
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(names[0], ignore_errors=True)


def fingerprint(res) -> tuple:
    return (res.status, res.final_params.tobytes(), res.metrics["test_accuracy"].tobytes(),
            res.metrics["train_loss"].tobytes(), res.clients["weight"].tobytes(), res.clients["train_loss"].tobytes(),
            res.class_counts.tobytes())


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", sorted(CASES))
def test_world_run_is_bitwise_the_one_rank_run(folder, case):
    comm = MPI.COMM_WORLD
    d, nets, mine = folder
    model, dataset, partition, extra = (s.replace("NETS", nets).replace("DATA", mine) for s in CASES[case][:4])
    sets = CASES[case][4]
    jobfile = Path(d) / f"{case}.toml"
    if comm.rank == 0:   # the runs' working folder is not the job's: the module is found next to the job file
        jobfile.write_text(job_text(model, dataset, partition, extra=extra, clients=5))
    comm.Barrier()
    ref = hpcfl.run(jobfile, out=Path(d) / f"{case}-one", overrides=sets, comm=MPI.COMM_SELF) if comm.rank == 0 \
        else None
    ref = comm.bcast(fingerprint(ref) if ref is not None else None, root=0)
    got = hpcfl.run(jobfile, out=Path(d) / f"{case}-all", overrides=sets)
    assert got.attrs["world_size"] == comm.size
    assert fingerprint(got) == ref, f"{case}: not bitwise the one-rank run"
    assert got.attrs["plugins"]["model.name"]["name"] == model
