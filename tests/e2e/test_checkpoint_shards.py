"""Checkpoints written by every rank (docs/reliability.md, "Checkpoints of any size"): a manifest and a
shard per rank, rotated together, resumed bitwise on other rank counts, and a shard missing, truncated
or altered sends the resume to the older checkpoint, also on another rank count.

The job is test_reliability's (SCAFFOLD with server momentum, a checkpoint every 2 rounds, 3 kept):
per-client rows go into the shards, the model and server state into the manifest.
"""

import json
import shutil

import h5py
import pytest
from clirun import assert_same_run, hpcfl
from test_reliability import JOB, finish, job

from hpcfl.io.ckptshards import SHARD_RE


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    from clirun import reference_run
    return reference_run(tmp_path_factory, JOB, "ref")


def killed_at_9(tmp_path, ranks=2, *more):
    """JOB on ``ranks`` ranks, rank 0 killed in round 9's training: checkpoints of rounds 2, 4, 6, 8."""
    jobfile, out = job(tmp_path), tmp_path / "out"
    p = hpcfl("run", jobfile, "--out", str(out), *more, ranks=ranks, env={"HPCFL_FAULT": "0:train:9:kill"})
    assert p.returncode != 0, p.stdout
    return jobfile, out, out / "checkpoints"


def shards_of(ckpts, rnd):
    return sorted(p.name for p in ckpts.iterdir() if (m := SHARD_RE.match(p.name)) and int(m.group(1)) == rnd)


def test_every_rank_writes_a_shard_rotation_takes_them_with_the_manifest_and_3_ranks_resume_bitwise(ref, tmp_path):
    jobfile, out, ckpts = killed_at_9(tmp_path)
    manifests = sorted(p.name for p in ckpts.glob("ckpt-*.h5") if not SHARD_RE.match(p.name))
    assert manifests == ["ckpt-00000004.h5", "ckpt-00000006.h5", "ckpt-00000008.h5"]   # 2 rotated out
    assert shards_of(ckpts, 2) == []                                                  # ... with its shards
    for rnd in (4, 6, 8):
        names = shards_of(ckpts, rnd)
        assert len(names) == 2 and [n[-8:] for n in names] == ["00000.h5", "00001.h5"]
        with h5py.File(ckpts / f"ckpt-{rnd:08d}.h5", "r") as f:
            assert f.attrs["format_version"] == 2
            assert [e["name"] for e in json.loads(f.attrs["shards"])] == names
            assert "model" in f["arrays"] and not any(k.startswith("clients.") for k in f["arrays"])   # rows: shards
        rows = 0
        for n in names:
            with h5py.File(ckpts / n, "r") as f:
                runs = f["arrays/rows"][()]
                rows += int((runs[:, 1] - runs[:, 0]).sum())
                assert all(f[f"arrays/{k}"].shape[0] == int((runs[:, 1] - runs[:, 0]).sum())
                           for k in f["arrays"] if k.startswith("clients."))
        assert rows == 6                                                                # 6 clients, once each
    p = finish(jobfile, out, ranks=3)
    assert "resuming from ckpt-00000008.h5" in p.stdout
    assert_same_run(ref / "out", out)


def _damage(path, how):
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "altered":   # one bit of one client's row: the file opens, its hash does not match
        with h5py.File(path, "r") as f:
            name = next(k for k in f["arrays"] if k.startswith("clients."))
            offset = f[f"arrays/{name}"].id.get_offset()
        with open(path, "r+b") as f:
            f.seek(offset + 5)
            byte = f.read(1)
            f.seek(offset + 5)
            f.write(bytes([byte[0] ^ 0x10]))
    else:   # replaced: another save's valid shard of the same rank under this name
        older = shards_of(path.parent, 6)[int(path.name[-8:-3])]
        shutil.copyfile(path.parent / older, path)


@pytest.mark.parametrize("how,ranks", [("missing", 0), ("truncated", 3), ("altered", 0), ("replaced", 2)])
def test_a_damaged_shard_sends_the_resume_to_the_older_checkpoint(ref, tmp_path, how, ranks):
    jobfile, out, ckpts = killed_at_9(tmp_path)
    _damage(ckpts / shards_of(ckpts, 8)[1], how)
    p = finish(jobfile, out, ranks=ranks)
    assert "ckpt-00000008.h5 skipped" in p.stdout and "resuming from ckpt-00000006.h5" in p.stdout, p.stdout
    assert {"missing": "is missing", "truncated": "truncated", "altered": "checksum",
            "replaced": "checksum"}[how] in p.stdout, p.stdout
    assert_same_run(ref / "out", out)


def test_shards_no_manifest_names_are_removed_and_a_damaged_manifest_is_passed_over(ref, tmp_path):
    jobfile, out, ckpts = killed_at_9(tmp_path)
    debris = ckpts / "ckpt-00000010.0badf00d.shard-00001.h5"             # a save killed before its manifest
    shutil.copyfile(ckpts / shards_of(ckpts, 8)[1], debris)
    stray = ckpts / ".ckpt-00000010.0badf00d.shard-00000.h5.tmp-4242"    # ... and before its rename
    stray.write_bytes(b"partial")
    old = shards_of(ckpts, 8)
    (ckpts / "ckpt-00000008.h5").write_bytes(b"not hdf5 any more")         # a damaged manifest
    p = finish(jobfile, out, ranks=0)
    assert "ckpt-00000008.h5 skipped" in p.stdout and "resuming from ckpt-00000006.h5" in p.stdout
    assert not debris.exists() and not stray.exists()
    # Round 8 was saved again (one rank: one file) over the damaged manifest, and its old shards went with it.
    assert not any((ckpts / n).exists() for n in old) and shards_of(ckpts, 10) == []
    assert_same_run(ref / "out", out)


def test_with_shards_off_two_ranks_write_one_file_and_resume_bitwise(ref, tmp_path):
    jobfile, out, ckpts = killed_at_9(tmp_path, 2, "--set", "checkpoint.shards=false")
    assert not any(SHARD_RE.match(p.name) for p in ckpts.iterdir())
    with h5py.File(ckpts / "ckpt-00000008.h5", "r") as f:
        assert f.attrs["format_version"] == 1 and any(k.startswith("clients.") for k in f["arrays"])
    p = finish(jobfile, out, ranks=2)     # shards on again (safe to change): the one file resumes
    assert "resuming from ckpt-00000008.h5" in p.stdout
    assert_same_run(ref / "out", out)
