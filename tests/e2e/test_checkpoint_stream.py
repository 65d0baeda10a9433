"""Checkpoints streamed rank by rank (docs/reliability.md, "Checkpoints of any size"): resume
bitwise on 1, 2 and 3 ranks, from files written before streaming, and past hand-made files.

The job is test_reliability's (SCAFFOLD with server momentum: per-client rows, server state and
the exact sum's grid all travel through the checkpoint).
"""

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from clirun import assert_same_run, hpcfl
from test_reliability import JOB, finish, job

from hpcfl.io.checkpoint import payload_sha256
from hpcfl.io.reader import load

# Written by the code before streaming (hpcfl at commit "main" of 2026-11-27) from JOB on 1 rank,
# killed in round 5 (HPCFL_FAULT=0:train:5:kill): the format is unchanged, so it must load and resume
# bitwise (with this machine's numbers: another CPU may round the last bit of a kernel differently).
# To regenerate after a change of the job's canonical form: run JOB that way with that code and
# copy <out>/checkpoints/ckpt-00000004.h5 here.
OLD = Path(__file__).resolve().parents[1] / "data" / "ckpt-v1-rel-00000004.h5"


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    from clirun import reference_run
    return reference_run(tmp_path_factory, JOB, "ref")


def killed(jobfile, out, rnd, ranks=0):
    """Run JOB into ``out`` until rank 0 is killed in round ``rnd``'s training."""
    p = hpcfl("run", jobfile, "--out", str(out), ranks=ranks, env={"HPCFL_FAULT": f"0:train:{rnd}:kill"})
    assert p.returncode != 0, p.stdout
    return p


@pytest.mark.parametrize("write,resume", [(3, 0), (0, 2), (2, 3)])
def test_streamed_checkpoint_resumes_bitwise_on_1_2_and_3_ranks(ref, tmp_path, write, resume):
    jobfile, out = job(tmp_path), tmp_path / "out"
    killed(jobfile, out, 7, ranks=write)                 # written by `write` ranks (0: one, no mpiexec)
    assert (out / "checkpoints" / "ckpt-00000006.h5").exists()
    p = finish(jobfile, out, ranks=resume)
    assert "resuming from ckpt-00000006.h5" in p.stdout
    assert_same_run(ref / "out", out)


def test_checkpoint_written_before_streaming_resumes_bitwise(ref, tmp_path):
    """The old file loads: its layout is today's, and a resume from it is bitwise.

    OLD's numbers came from another CPU. Float kernels may round the last bit differently on
    another instruction set (AVX2 against AVX-512), so its values are compared with a tolerance,
    and the bitwise resume uses OLD's file (attributes, layout, hash) holding this machine's
    round-4 state: what is under test is the format, not the CPU that wrote it.
    """
    jobfile, out = job(tmp_path), tmp_path / "out"
    killed(jobfile, out, 5)
    ckpts = out / "checkpoints"
    with h5py.File(OLD, "r") as old, h5py.File(ckpts / "ckpt-00000004.h5", "r") as new:
        assert set(old["arrays"]) == set(new["arrays"])            # the same layout and the same state
        assert dict(old.attrs).keys() == dict(new.attrs).keys()
        here = {k: new["arrays"][k][()] for k in new["arrays"]}
        for k in old["arrays"]:
            o = old["arrays"][k][()]
            assert (o.dtype, o.shape) == (here[k].dtype, here[k].shape), k
            np.testing.assert_allclose(o, here[k], rtol=1e-4, atol=1e-6, err_msg=k)
    (ckpts / "ckpt-00000002.h5").unlink()
    shutil.copyfile(OLD, ckpts / "ckpt-00000004.h5")              # only the old file to resume from
    craft(ckpts / "ckpt-00000004.h5", lambda a: a.update(here))   # ... with this machine's numbers
    p = finish(jobfile, out, ranks=3)
    assert "resuming from ckpt-00000004.h5" in p.stdout
    assert_same_run(ref / "out", out)


def test_checkpoint_written_before_streaming_resumes_as_it_was_written(tmp_path):
    """OLD as written (its own hash and numbers) passes every check and the run ends normally."""
    jobfile, out = job(tmp_path), tmp_path / "out"
    killed(jobfile, out, 5)
    ckpts = out / "checkpoints"
    for f in ckpts.glob("ckpt-*.h5"):
        f.unlink()
    shutil.copyfile(OLD, ckpts / "ckpt-00000004.h5")
    p = finish(jobfile, out, ranks=2)
    assert "resuming from ckpt-00000004.h5" in p.stdout and "does not fit" not in p.stdout
    res = load(out)
    assert res.attrs["status"] == "finished" and len(res.metrics["round"]) == 10


# ------------------------------------------------------------- hand-made (hash-consistent) files
def craft(path: Path, edit) -> None:
    """Rewrite checkpoint ``path``'s arrays with ``edit(arrays)`` and a matching payload_sha256."""
    with h5py.File(path, "r+") as f:
        arrays = {k: ds[()] for k, ds in f["arrays"].items()}
        edit(arrays)
        del f["arrays"]
        g = f.create_group("arrays")
        for k, v in arrays.items():
            g.create_dataset(k, data=v)
        f.attrs["payload_sha256"] = payload_sha256(arrays)


CRAFTED = {
    "model of the wrong length": (lambda a: a.update(model=a["model"][:-1]), "'model' is float32 of shape"),
    "2-D model": (lambda a: a.update(model=a["model"].reshape(1, -1)), "'model' is float32 of shape (1,"),
    "no model": (lambda a: a.pop("model"), "it has no array 'model'"),
    "wrong exact_grid": (lambda a: a.update({"server.exact_grid": np.append(a["server.exact_grid"], 0).astype(
        a["server.exact_grid"].dtype)}), "'server.exact_grid' is int16 of shape"),
}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """JOB killed in round 7: checkpoints 2, 4 and 6."""
    d = tmp_path_factory.mktemp("stopped")
    killed(job(d), d / "out", 7)
    return d / "out"


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_newest_checkpoint_falls_back_to_an_older_one(ref, stopped, tmp_path, case):
    edit, reason = CRAFTED[case]
    out = tmp_path / "out"
    shutil.copytree(stopped, out)
    craft(out / "checkpoints" / "ckpt-00000006.h5", edit)
    p = finish(job(tmp_path), out)
    assert "ckpt-00000006.h5 does not fit this job" in p.stdout and reason in p.stdout, p.stdout
    assert "resuming from the older ckpt-00000004.h5" in p.stdout
    assert "Traceback" not in p.stderr
    assert_same_run(ref / "out", out)


@pytest.mark.parametrize("case", ["no model", "wrong exact_grid"])   # the other two fail the same check
def test_crafted_checkpoint_without_a_valid_older_one_exits_2(stopped, tmp_path, case):
    edit, reason = CRAFTED[case]
    out = tmp_path / "out"
    shutil.copytree(stopped, out)
    for old in ("ckpt-00000002.h5", "ckpt-00000004.h5"):
        (out / "checkpoints" / old).unlink()
    newest = out / "checkpoints" / "ckpt-00000006.h5"
    craft(newest, edit)
    before = {p.name: p.read_bytes() for p in (newest, out / "results.h5")}
    p = hpcfl("run", job(tmp_path), "--out", str(out))
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    assert f"checkpoint {newest} does not fit this job" in p.stderr and reason in p.stderr
    assert "--force" in p.stderr
    assert before == {p.name: p.read_bytes() for p in (newest, out / "results.h5")}   # nothing touched
