"""The Slurm templates submitted to a real Slurm, as users submit them: a one-node cluster on
localhost (tests/e2e/slurm_cluster.py: Debian's slurm-wlm 22.05 and munge), CPU variants of the
templates (the GPU request dropped with sbatch's --gpus-per-task=0, the documented edit point),
the small quickstart. Results are compared bitwise with runs outside Slurm.

Skipped where Slurm and MUNGE are not installed or not root; with HPCFL_REQUIRE_SLURM=1 (CI) a
cluster that does not start fails instead. Cost: 7.5 minutes measured on 2 cores shared with other
work (load 10 to 14), under a minute of CPU time ours; the requeue test is the longest (3 to 4
min), its attempts paced by Slurm's 30-s time-limit checks. The array and multi-node tests run on
a three-node cluster: tests/e2e/test_slurm_multinode.py.
"""

import math
import os
import re
import resource
import sys
import time
from pathlib import Path

import pytest

from clirun import ROOT, assert_same_run, hpcfl, start
from slurm_cluster import TERMINAL, Cluster, cluster_or_skip
from test_slurm import TEMPLATE_ENV, directives

# Slurm jobs queue behind each other on 2 cores, and a test includes its fixtures (the references)
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

QUICK = ROOT / "jobs" / "quickstart.toml"
SWEEP = ROOT / "jobs" / "sweep_quickstart.toml"
# What the templates add to the command line on a 1-core task (runtime.threads = cpus-per-task):
# the references outside Slurm run with the same settings.
TEMPLATE_SETS = ["--set", "runtime.device=cpu", "--set", "runtime.threads=1", "--set", "checkpoint.every_minutes=10"]
# A CPU variant of every template: 1 core per rank, memory within a small CI machine's.
ONE_CORE = ("--cpus-per-task=1", "--mem-per-cpu=1G")
# requeue.sbatch runs with --time=1 (minute) and USR1 WARN seconds before the end. slurmctld checks
# time limits every 30 s; it sends the signal at the first check at most WARN + 30 s before the
# end: 25 to 55 s into the first attempt (the ranks are up by then even on a loaded machine), and
# about 50 s into a requeued one (it starts some 10 s after the check whose signal stopped the
# attempt before: the stop, cred_expire=5, a scheduler pass). The time limit's kill would come at
# a later check, at least 30 s after the signal.
WARN = 5
LONG_SECONDS = 70      # the requeued job's rounds take about this long at 1 rank (calibrated here):
#                        more than the first attempt holds, so it is stopped at least once
REQUEUE_CAP = 8        # room for the 2 to 4 attempts LONG_SECONDS needs, on a loaded machine too


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = cluster_or_skip(tmp_path_factory.mktemp("slurm"), "test cluster")
    yield c
    c.stop()


class Work:
    """A folder to submit from, laid out as the repository root (``jobs/`` and ``slurm/`` are the
    repo's), so the templates' default JOB and OUT paths and their shared slurm/hpcfl_srun.sh work
    as for a user; ``python`` on PATH is this interpreter."""

    def __init__(self, cluster: Cluster, d: Path):
        self.cluster, self.dir = cluster, d
        (d / "jobs").symlink_to(ROOT / "jobs")
        (d / "slurm").symlink_to(ROOT / "slurm")
        bin_ = d / "bin"
        bin_.mkdir()
        (bin_ / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_ / "python").chmod(0o755)
        base = {k: v for k, v in os.environ.items() if k not in TEMPLATE_ENV}
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self.env = cluster.env(base, PATH=f"{bin_}{os.pathsep}{base.get('PATH', '')}", PYTHONPATH=pythonpath)

    def sbatch(self, template, *options, **env) -> int:
        script = template if isinstance(template, Path) else ROOT / "slurm" / f"{template}.sbatch"
        extra = {k: str(v) for k, v in env.items()}
        return self.cluster.sbatch(script, *options, cwd=self.dir, env={**self.env, **extra})

    def sbatch_wrap(self, command, *options) -> int:
        """A job without a template: ``sbatch --wrap COMMAND``, its log named as the templates' are."""
        p = self.cluster._run("sbatch", "--parsable", "--output=slurm-wrap-%j.out", *options, "--wrap", command,
                              cwd=self.dir, env=self.env)
        assert p.returncode == 0, p.stderr
        return int(p.stdout.strip().split(";")[0])

    def log_path(self, job_id, task=None) -> Path:
        found = list(self.dir.glob(f"slurm-*-{job_id}.out" if task is None else f"slurm-*-{job_id}_{task}.out"))
        return found[0] if found else self.dir / f"(no log of job {job_id})"

    def log(self, job_id, task=None) -> str:
        p = self.log_path(job_id, task)
        return p.read_text(errors="replace") if p.exists() else ""

    def wait_log(self, job_id, pattern, count=1, timeout=180) -> str:
        """Until the job's log matches ``pattern`` (a regex) ``count`` times; fails if the job ends
        first or at the timeout (and then cancels it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ended = (self.cluster.jobs(job_id) or [{}])[0].get("JobState") in TERMINAL
            text = self.log(job_id)
            if len(re.findall(pattern, text)) >= count:
                return text
            if ended:
                raise AssertionError(f"job {job_id} ended before its log had {pattern!r} x{count}:\n{text[-3000:]}")
            time.sleep(0.25)
        self.cluster.cancel(job_id)
        raise AssertionError(f"job {job_id}: {pattern!r} x{count} not in its log after {timeout} s:\n"
                             f"{self.log(job_id)[-3000:]}")

    def job_file(self, name, base: Path, rounds: int) -> Path:
        text = base.read_text()
        assert "\nrounds = 30\n" in text
        path = self.dir / name
        path.write_text(text.replace("\nrounds = 30\n", f"\nrounds = {rounds}\n"))
        return path


@pytest.fixture
def work(cluster, tmp_path):
    return Work(cluster, tmp_path)


def one(records):
    assert len(records) == 1, records
    return records[0]


def stopped_rounds(log, signal):
    return [int(r) for r in re.findall(rf"stopped by {signal} after round (\d+) with a checkpoint", log)]


def resumed_rounds(log):
    return [int(r) for r in re.findall(r"resuming from ckpt-\d+\.h5 \(written after round (\d+)\)", log)]


# ---- references, outside Slurm -----------------------------------------------------------

@pytest.fixture(scope="module")
def quick_ref(tmp_path_factory):
    """The quickstart at 2 ranks under mpiexec."""
    out = tmp_path_factory.mktemp("quick_ref") / "out"
    p = hpcfl("run", str(QUICK), "--out", str(out), *TEMPLATE_SETS, ranks=2, timeout=300)
    assert p.returncode == 0, p.stderr
    return out


class LongJob:
    """The quickstart with enough rounds to run about LONG_SECONDS at 1 rank on this machine now
    (CPU time of 80 rounds against 20), and its uninterrupted run at 1 rank, started
    in the background while the Slurm jobs run; :meth:`ref` waits for it."""

    def __init__(self, d: Path):
        # CPU seconds of two lengths: the difference cancels what does not grow with rounds (start-up,
        # the final write), and CPU time, unlike wall time, does not grow with the other test
        # worker's load. Sized from wall time, rounds counted 2.7 times slower than the Slurm job
        # ran them, which then ended inside its first attempt (647 rounds in 27 s). A loaded
        # Slurm job only runs longer: more attempts, within REQUEUE_CAP.
        per_round = (self._cpu(d / "calib80", 80) - self._cpu(d / "calib20", 20)) / 60
        self.rounds = min(max(math.ceil(LONG_SECONDS / max(per_round, 0.005)), 200), 4000)
        self.path = d / "long.toml"
        self.path.write_text(QUICK.read_text().replace("\nrounds = 30\n", f"\nrounds = {self.rounds}\n"))
        self.out = d / "out"
        self.proc = start("run", str(self.path), "--out", str(self.out), *TEMPLATE_SETS)

    @staticmethod
    def _cpu(out: Path, rounds: int) -> float:
        """CPU seconds (user and system) of ``rounds`` quickstart rounds at 1 rank, one thread."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        calib = hpcfl("run", str(QUICK), "--out", str(out), *TEMPLATE_SETS, "--set", f"run.rounds={rounds}",
                      timeout=300)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert calib.returncode == 0, calib.stderr
        return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

    def ref(self, timeout=600) -> Path:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return self.out


@pytest.fixture(scope="module")
def long_job(tmp_path_factory):
    job = LongJob(tmp_path_factory.mktemp("long"))
    yield job
    if job.proc.poll() is None:
        job.proc.kill()
        job.proc.wait()


# ---- the templates ---------------------------------------------------------------------

def test_cpu_only_two_ranks_complete_as_under_mpiexec(cluster, work, quick_ref):
    """cpu_only.sbatch as shipped (JOB, OUT, HPCFL_MPI=pmi2), 2 ranks of 1 core: one world of
    2 ranks, COMPLETED, and the results bitwise those of mpiexec -n 2."""
    jid = work.sbatch("cpu_only", "--ntasks-per-node=2", *ONE_CORE)
    rec = one(cluster.wait_done(jid, timeout=300, log=work.log_path(jid)))
    log = work.log(jid)
    assert (rec["JobState"], rec["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert cluster.completions(jid)[-1]["JobState"] == "COMPLETED"
    assert log.count("2 rank(s)") == 1 and "1 rank(s)" not in log, log
    assert "Slurm started" not in log
    assert_same_run(work.dir / "runs" / "quickstart-cpu", quick_ref)


def test_requeue_signal_before_the_limit_checkpoint_requeue_resume(cluster, work, long_job):
    """requeue.sbatch with --time=1 and its --signal brought to @WARN: Slurm's USR1 reaches the
    batch shell, is forwarded, the rank checkpoints and exits 75, the job is requeued with
    SLURM_RESTART_COUNT set, the next attempt resumes; at the end the results are bitwise those
    of the uninterrupted run."""
    signal_opt = re.sub(r"@\d+$", f"@{WARN}", directives("requeue")["--signal"])   # keeps B:USR1
    assert signal_opt == f"B:USR1@{WARN}"
    jid = work.sbatch("requeue", "--gpus-per-task=0", "--ntasks-per-node=1", *ONE_CORE, "--time=1",
                      f"--signal={signal_opt}", JOB=long_job.path, HPCFL_DEVICE="cpu", MAX_REQUEUES=REQUEUE_CAP)
    rec = one(cluster.wait_done(jid, timeout=REQUEUE_CAP * 75, log=work.log_path(jid)))
    log = work.log(jid)
    assert (rec["JobState"], rec["ExitCode"]) == ("COMPLETED", "0:0"), log
    restarts = int(rec["Restarts"])
    assert restarts >= 1, f"never stopped: {long_job.rounds} rounds finished within one attempt\n{log}"
    assert log.count("got USR1") == restarts, log
    assert log.count("task 0: Exited with exit code 75") == restarts, log
    stops = stopped_rounds(log, "SIGUSR1")
    # (a stop that lands in the last round checkpoints round N of N; the next attempt only finishes)
    assert len(stops) == restarts and stops == sorted(stops) and stops[-1] <= long_job.rounds, log
    assert resumed_rounds(log) == stops, "each attempt resumes where the one before stopped"
    for k in range(1, restarts + 1):   # SLURM_RESTART_COUNT as the template reads it
        assert f"requeue {k} of at most {REQUEUE_CAP})" in log and f"attempt {k + 1}, out" in log, log
    assert "hpcfl: finished" in log and "TIMEOUT" not in log and "CANCELLED DUE TO TIME LIMIT" not in log
    assert [r["JobState"] for r in cluster.completions(jid)] == ["PENDING"] * restarts + ["COMPLETED"]
    assert_same_run(work.dir / "runs" / "quickstart-long", long_job.ref())


def test_requeue_cap_is_honoured(cluster, work):
    """MAX_REQUEUES=1 and a job that would run for hours, stopped by hand as slurm/README.md
    says (scancel --signal=USR1 --batch): the first stop is requeued, the second is not (the job
    ends FAILED with 75 and says how to go on); the checkpoint of the last stop is there."""
    job = work.job_file("endless.toml", QUICK, rounds=100000)
    jid = work.sbatch("requeue", "--gpus-per-task=0", "--ntasks-per-node=1", *ONE_CORE, JOB=job, HPCFL_DEVICE="cpu",
                      MAX_REQUEUES=1)
    work.wait_log(jid, r"startup [\d.]+ s")           # the rank is about to train
    cluster.signal(jid, "USR1", batch=True)
    work.wait_log(jid, r"startup [\d.]+ s", count=2)  # requeued, and training again
    assert "attempt 2, out" in work.log(jid)
    cluster.signal(jid, "USR1", batch=True)
    log = work.wait_log(jid, r"NOT FINISHED|requeue 2 of")
    assert "requeue 2 of" not in log, log
    rec = one(cluster.wait_done(jid, timeout=120, log=work.log_path(jid)))
    log = work.log(jid)
    assert (rec["JobState"], rec["ExitCode"], rec["Restarts"]) == ("FAILED", "75:0", "1"), log
    assert "requeue 1 of at most 1)" in log and "requeue 2 of" not in log
    assert "NOT FINISHED after 1 requeue(s) (MAX_REQUEUES=1)" in log
    assert [r["JobState"] for r in cluster.completions(jid)] == ["PENDING", "FAILED"]
    stops = stopped_rounds(log, "SIGUSR1")
    assert len(stops) == 2 and resumed_rounds(log) == stops[:1], log
    ckpts = sorted((work.dir / "runs" / "quickstart-long" / "checkpoints").glob("ckpt-*.h5"))
    assert ckpts and ckpts[-1].name == f"ckpt-{stops[-1]:08d}.h5"


def test_scancel_term_checkpoints_requeues_and_resumes(cluster, work, quick_ref):
    """scancel --signal=TERM on a running cpu_only job (2 ranks, the quickstart), sent as its
    rounds begin: the ranks checkpoint and exit 75, and cpu_only.sbatch requeues itself as every
    template does (slurm/hpcfl_srun.sh); the next attempt resumes and finishes with mpiexec's
    results."""
    jid = work.sbatch("cpu_only", "--ntasks-per-node=2", *ONE_CORE)
    work.wait_log(jid, r"startup [\d.]+ s")   # printed as round 1 starts: the TERM lands mid-run
    cluster.signal(jid, "TERM")
    rec = one(cluster.wait_done(jid, timeout=300, log=work.log_path(jid)))
    log = work.log(jid)
    assert (rec["JobState"], rec["ExitCode"], rec["Restarts"]) == ("COMPLETED", "0:0", "1"), log
    stops = stopped_rounds(log, "SIGTERM")
    assert len(stops) == 1 and stops[0] < 30, log
    assert "requeue 1 of at most 5)" in log and "attempt 2, out runs/quickstart-cpu" in log, log
    assert resumed_rounds(log) == stops, log
    assert [r["JobState"] for r in cluster.completions(jid)] == ["PENDING", "COMPLETED"]
    assert_same_run(work.dir / "runs" / "quickstart-cpu", quick_ref)


# ---- launching ranks -------------------------------------------------------------------

def test_srun_without_pmi_stops_every_task_with_exit_2(cluster, work):
    """HPCFL_MPI empty: srun uses the site's MpiDefault (none here), as the templates did before:
    two 1-rank worlds. Every task exits 2 before touching OUT; the fix is printed once."""
    jid = work.sbatch("cpu_only", "--ntasks-per-node=2", *ONE_CORE, HPCFL_MPI="")
    rec = one(cluster.wait_done(jid, timeout=180, log=work.log_path(jid)))
    log = work.log(jid)
    assert (rec["JobState"], rec["ExitCode"]) == ("FAILED", "2:0"), log
    assert log.count("Slurm started 2 tasks in this step") == 1 and "srun --mpi=pmi2" in log, log
    # srun names the tasks that exited 2: "tasks 0-1", or one line per task
    assert re.search(r"tasks 0-1: Exited with exit code 2", log) or (
        "task 0: Exited with exit code 2" in log and "task 1: Exited with exit code 2" in log), log
    assert not (work.dir / "runs").exists()


def test_mpiexec_inside_the_allocation_is_one_world(cluster, work):
    """The other way to start the ranks: mpiexec (the wheel's hydra) inside an sbatch allocation
    of 2 tasks: one world of 2, no warning."""
    jid = work.sbatch_wrap("mpiexec -n 2 python -m mpi4py -m hpcfl info", "--ntasks=2", *ONE_CORE)
    rec = one(cluster.wait_done(jid, timeout=180, log=work.log_path(jid)))
    log = work.log(jid)
    assert (rec["JobState"], rec["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert "ranks: 2" in log and "ranks: 1" not in log and "Slurm started" not in log, log


# A rank that speaks PMI-1 to Slurm's pmi2 plugin as MPICH does (tests/e2e/test_slurm_cluster.py):
# the first launch sends a put longer than the 1024 bytes the plugin reads at once, as MPICH's
# address segments can be, and gives up as MPI_Init does; the next launch sends a well-formed one.
PMI_RANK = r'''
import os, socket, sys, time
from pathlib import Path

sock = socket.socket(fileno=int(os.environ["PMI_FD"]))
sock.settimeout(20)

def say(line):
    sock.sendall(line.encode())
    return sock.recv(4096).decode()

assert "rc=0" in say("cmd=init pmi_version=1 pmi_subversion=1\n")
first = Path(sys.argv[1])
if not first.exists():
    first.write_text("misread")
    sock.sendall(("cmd=put kvsname=x key=addr value=" + "A" * 1100 + "\n").encode())
    if sys.argv[2] == "hang":       # wait in MPI_Init for ever, as MPICH's ranks did in CI
        time.sleep(3600)
    sys.exit(16)
assert "rc=0" in say("cmd=put kvsname=" + say("cmd=get_my_kvsname\n").split("kvsname=")[1].split()[0]
                     + " key=addr value=" + "B" * 900 + "\n")
print("pmi put of 900 characters: ok")
say("cmd=finalize\n")
'''


@pytest.mark.parametrize("then", ["abort", "hang"])
def test_a_launch_that_slurm_pmi2_misread_is_started_again(cluster, work, then):
    """Slurm's pmi2 plugin reads a PMI-1 line with one read() of at most 1024 bytes; a longer line
    (MPICH's address segments with the command's words) is misread and the ranks abort in MPI_Init,
    or wait there for ever for the lost line's answer (seen in CI). slurm/hpcfl_srun.sh recognises
    what srun prints then, ends a launch still waiting 5 s later, and launches again in the same job."""
    (work.dir / "pmi_rank.py").write_text(PMI_RANK)
    script = work.dir / "misread.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --output=slurm-misread-%j.out\nOUT=runs/none\n"
                      f'. slurm/hpcfl_srun.sh\nhpcfl_srun --mpi=pmi2 -n 1 python pmi_rank.py "$PWD/first" {then}\n')
    jid = work.sbatch(script, "--ntasks=1", *ONE_CORE)
    rec = one(cluster.wait_done(jid, timeout=180, log=work.log_path(jid)))
    log = work.log(jid)
    assert (rec["JobState"], rec["ExitCode"], rec["Restarts"]) == ("COMPLETED", "0:0", "0"), log
    # what Slurm 22.05 prints for the misread line (the pattern slurm/hpcfl_srun.sh looks for)
    assert "mpi/pmi2: invalid client request" in log, log
    assert log.count("launching again (1 of at most 2") == 1, log
    assert "pmi put of 900 characters: ok" in log and "hpcfl: finished" in log, log
    assert ("ending this launch" in log) == (then == "hang"), log
