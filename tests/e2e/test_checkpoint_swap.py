"""Issue 37.2 end to end: run A stopped with checkpoints; run B live; B's checkpoint folder is moved away
and a link to A's put in its place mid-run. A's checkpoints survive byte for byte, B exits 2 naming
where its folder went, and once the folder is put back B resumes and finishes."""

import hashlib
import time

from clirun import digits_job, hpcfl, kill_group, start
from hpcfl.results import load

JOB = digits_job("swap", 5, 3, "[checkpoint]\nevery = 1\nkeep = 2\n")


def snapshot(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_checkpoint_folder_swapped_for_a_link_mid_run_touches_neither_and_b_resumes(tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    job = str(tmp_path / "job.toml")
    a, b = tmp_path / "A", tmp_path / "B"
    assert hpcfl("run", job, "--out", str(a)).returncode == 0
    before = snapshot(a / "checkpoints")
    long = ["--set", "run.rounds=400", "--set", "run.eval_every=0"]
    p = start("run", job, "--out", str(b), *long)
    try:
        deadline = time.monotonic() + 120
        while not (b / "checkpoints" / "ckpt-00000002.h5").exists():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.01)
        (b / "checkpoints").rename(tmp_path / "B-moved")   # mv B/checkpoints B-moved
        (b / "checkpoints").symlink_to(a / "checkpoints")   # ln -s A/checkpoints B/checkpoints
        stdout, stderr = p.communicate(timeout=120)
    finally:
        kill_group(p)
    assert p.returncode == 2, (p.returncode, stderr[-2000:])
    assert "was replaced while this run was live" in stderr and f"now at {tmp_path / 'B-moved'}" in stderr, stderr
    assert "Traceback" not in stderr
    assert snapshot(a / "checkpoints") == before                  # nothing written, nothing rotated away
    short = ["--set", "run.rounds=12", "--allow-change", "run.rounds", "--set", "run.eval_every=0"]
    r = hpcfl("run", job, "--out", str(b), *short)                 # B rerun with the link still there
    assert r.returncode == 2 and "is a symbolic link" in r.stderr and "never follows a link" in r.stderr, r.stderr
    assert snapshot(a / "checkpoints") == before
    (b / "checkpoints").unlink()
    (tmp_path / "B-moved").rename(b / "checkpoints")              # the fix the message gives
    q = hpcfl("run", job, "--out", str(b), *short)
    assert q.returncode == 0 and "resuming from ckpt-" in q.stdout, q.stderr[-2000:]
    res = load(b)   # bitwise equality of a resumed run with an uninterrupted one: test_reliability.py
    assert res.attrs["status"] == "finished" and res.metrics["round"].tolist() == list(range(1, 13))
