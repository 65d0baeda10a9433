"""The Slurm templates on a 3-node cluster on one machine (tests/e2e/netns_nodes.py): every node
its own network, UTS, mount, IPC and PID namespaces and /dev/shm, joined by veths to a bridge, so
MPI between nodes crosses the network (checked on the veth counters). CPU-only nodes; the jobs
are submitted as a user types them and compared bitwise with mpiexec runs of the same job.

What this covers: one MPI world over several hostnames through srun --mpi=pmi2 (Slurm 22.05, the
mpich wheel's UCX over TCP), the templates' task counts from -N/--ntasks-per-node, the requeue on
75 across nodes, an array spread over the nodes, a node lost mid-run. What it does not: a real
interconnect (InfiniBand, Slingshot), PMIx, GPUs, a shared file system other than the local one.

Skipped where Slurm, MUNGE or the namespaces are not available or not root; with
HPCFL_REQUIRE_SLURM=1 (CI) a cluster that does not start fails instead. Cost: 5 minutes of wall
time, about 2.5 CPU-minutes, on 2 cores shared with other work (load 8 to 12).
"""

import json
import os
import time
from pathlib import Path

import pytest

from clirun import assert_same_run, hpcfl, start
from slurm_cluster import TERMINAL, cluster_or_skip
from test_slurm_cluster import ONE_CORE, QUICK, SWEEP, TEMPLATE_SETS, Work, one, resumed_rounds, stopped_rounds

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

NODES = 3
# what a user types for a CPU-only multi-node job (slurm/README.md, multi_node.sbatch's header)
AS_TYPED = ("--ntasks-per-node=1", "--cpus-per-task=1", "--gpus-per-task=0")
MODEL_BYTES = (64 * 64 + 64 + 64 * 10 + 10) * 4   # the quickstart's MLP [64] on 8x8 digits, float32
# a job long enough to be stopped or lose a node mid-run; periodic checkpoints every few rounds
LONG_ROUNDS, EVERY = 40, 4
# a dead peer ends the run through MPI at once; the watchdog bounds it should MPI not notice (H2's
# default may change: set here so that this test does not depend on it)
WATCHDOG_S = 60
LOST_BOUND_S = 90    # a lost node ends its job's attempt within this: SlurmdTimeout (20 s here) + slack


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = cluster_or_skip(tmp_path_factory.mktemp("slurm3"), "multi-node test cluster", nodes=NODES, slurmd_timeout=20)
    yield c
    c.stop()


@pytest.fixture
def work(cluster, tmp_path):
    return Work(cluster, tmp_path)


def quick_job(d, rounds, extra=""):
    text = QUICK.read_text()
    assert "\nrounds = 30\n" in text
    path = d / f"quick{rounds}.toml"
    path.write_text(text.replace("\nrounds = 30\n", f"\nrounds = {rounds}\n") + extra)
    return path


@pytest.fixture(scope="module")
def long_ref(tmp_path_factory):
    """The long job (periodic checkpoints, a watchdog) and its uninterrupted run at 2 ranks under
    mpiexec, started in the background while the Slurm jobs run; call to wait for it."""
    d = tmp_path_factory.mktemp("long2")
    job = quick_job(d, LONG_ROUNDS, f"\n[checkpoint]\nevery = {EVERY}\n\n[watchdog]\ntimeout_s = {WATCHDOG_S}\n")
    proc = start("run", str(job), "--out", str(d / "out"), *TEMPLATE_SETS, ranks=2)

    def ref():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        return d / "out"
    ref.job = job
    yield ref
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def srun(cluster, *argv, timeout=120):
    p = cluster._run("srun", *argv, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return p.stdout


# ---- the nodes ---------------------------------------------------------------------------

def test_nodes_share_nothing_but_the_file_system(cluster, tmp_path):
    """Each node has its own hostname and network, UTS, IPC, PID and mount namespaces (none the
    test's own), and a /dev/shm the other nodes do not see: a file one node writes there is not
    on the others (with a shared /dev/shm, UCX could pass MPI data through it)."""
    probe = ("echo $(hostname) " + " ".join(f"$(readlink /proc/self/ns/{ns})" for ns in ("net", "uts", "ipc", "pid",
                                                                                         "mnt"))
             + " && touch /dev/shm/hpcfl-probe-$(hostname) && sleep 2 && echo $(hostname) shm: $(ls /dev/shm)"
             + " && sleep 1 && rm /dev/shm/hpcfl-probe-$(hostname)")
    out = srun(cluster, f"-N{NODES}", "--ntasks-per-node=1", "--chdir", str(tmp_path), "bash", "-c", probe)
    lines = out.split("\n")
    ns_lines = [line.split() for line in lines if "net:[" in line]
    assert sorted(f[0] for f in ns_lines) == cluster.nodes, out
    own = {os.readlink(f"/proc/self/ns/{ns}") for ns in ("net", "uts", "ipc", "pid", "mnt")}
    for k in range(1, 6):   # net, uts, ipc, pid, mnt: one of each per node, none the host's
        ids = [f[k] for f in ns_lines]
        assert len(set(ids)) == NODES and not set(ids) & own, (k, ids)
    shm = {line.split()[0]: [f for f in line.split()[2:] if f.startswith("hpcfl-probe-")] for line in lines
           if " shm:" in line}
    assert shm == {n: [f"hpcfl-probe-{n}"] for n in cluster.nodes}, f"/dev/shm is shared between nodes: {shm}"


# ---- multi_node.sbatch as typed, bitwise with mpiexec ----------------------------------------

@pytest.mark.parametrize("nodes", [2, 3])
def test_multi_node_as_typed_is_one_world_over_the_network(cluster, work, nodes):
    """HPCFL_DEVICE=cpu sbatch -N <nodes> --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-task=0
    slurm/multi_node.sbatch, as typed: COMPLETED, one world of <nodes> ranks on <nodes> hosts, the
    results bitwise those of mpiexec -n <nodes>, and the MPI traffic went over the veths (at least
    one model per round through each node's link; an idle node's link stays quiet)."""
    rounds = 10
    job = quick_job(work.dir, rounds)
    ref = start("run", str(job), "--out", str(work.dir / "ref"), *TEMPLATE_SETS, ranks=nodes)
    before = cluster.net.counters()
    jid = work.sbatch("multi_node", f"-N{nodes}", *AS_TYPED, JOB=job, OUT="runs/multi", HPCFL_DEVICE="cpu")
    rec = one(cluster.wait_done(jid, timeout=400, log=work.log_path(jid)))
    moved = {n: b - before[n] for n, b in cluster.net.counters().items()}
    log = work.log(jid)
    assert (rec["JobState"], rec["ExitCode"], rec["NumNodes"], rec["NumTasks"]) == (
        "COMPLETED", "0:0", str(nodes), str(nodes)), log
    assert log.count(f"{nodes} rank(s)") == 1 and "Slurm started" not in log, log
    used = cluster.nodes[:nodes] if rec["NodeList"] == f"hpcfl-n[1-{nodes}]" else None
    assert used, rec["NodeList"]
    for n in used:
        assert moved[n] >= rounds * MODEL_BYTES, f"MPI data did not cross {n}'s veth: {moved}"
    for n in set(cluster.nodes) - set(used):
        assert moved[n] < rounds * MODEL_BYTES / 4, f"idle node {n} carried traffic: {moved}"
    _, err = ref.communicate(timeout=400)
    assert ref.returncode == 0, err
    assert_same_run(work.dir / "runs" / "multi", work.dir / "ref")


def test_test_only_says_where_a_job_would_start(cluster, work):
    """slurm/README.md: sbatch --test-only tells before submitting whether (and where) the request
    fits; the as-typed CPU request fits, the template's GPU request does not on CPU nodes."""
    p = cluster._run("sbatch", "--test-only", "-N2", *AS_TYPED, "slurm/multi_node.sbatch", cwd=work.dir,
                     env=work.env)
    assert p.returncode == 0 and "to start at" in p.stderr and "hpcfl-n" in p.stderr, p.stderr
    p = cluster._run("sbatch", "--test-only", "slurm/multi_node.sbatch", cwd=work.dir, env=work.env)
    assert p.returncode != 0, p.stderr


# ---- requeue across nodes ------------------------------------------------------------------

def test_requeue_across_nodes(cluster, work, long_ref):
    """multi_node.sbatch on 2 nodes, stopped as the time limit's USR1 would stop it (to the batch
    shell only): the shell forwards it, the ranks on both nodes checkpoint and exit 75, the job
    requeues itself (slurm/hpcfl_srun.sh), the next attempt resumes; bitwise mpiexec -n 2."""
    jid = work.sbatch("multi_node", "-N2", *AS_TYPED, JOB=long_ref.job, OUT="runs/long", HPCFL_DEVICE="cpu")
    work.wait_log(jid, r"startup [\d.]+ s", timeout=300)
    cluster.signal(jid, "USR1", batch=True)
    rec = one(cluster.wait_done(jid, timeout=600, log=work.log_path(jid)))
    log = work.log(jid)
    assert (rec["JobState"], rec["ExitCode"], rec["Restarts"]) == ("COMPLETED", "0:0", "1"), log
    assert log.count("got USR1") == 1, log
    stops = stopped_rounds(log, "SIGUSR1")
    assert len(stops) == 1 and stops[0] < LONG_ROUNDS, log
    assert "requeue 1 of at most 5)" in log and "attempt 2, out runs/long" in log, log
    assert resumed_rounds(log) == stops, log
    assert [r["JobState"] for r in cluster.completions(jid)] == ["PENDING", "COMPLETED"]
    assert_same_run(work.dir / "runs" / "long", long_ref())


# ---- a node lost ---------------------------------------------------------------------------

def test_node_lost_mid_run_ends_the_attempt_and_the_requeued_job_resumes(cluster, work, long_ref):
    """multi_node.sbatch on 2 of the 3 nodes; after a periodic checkpoint, the node that is not the
    batch host dies (its slurmd and its rank killed at once, as a node that loses power). Slurm
    notices within SlurmdTimeout and ends the attempt (MPI alone does not notice: UCX over TCP
    leaves the surviving rank waiting), within LOST_BOUND_S; the job is requeued (--requeue,
    JobRequeue=1), starts again on the nodes still up, resumes from the newest checkpoint and
    finishes bitwise as mpiexec -n 2 did uninterrupted."""
    out = work.dir / "runs" / "lost"
    jid = work.sbatch("multi_node", "-N2", *AS_TYPED, JOB=long_ref.job, OUT="runs/lost", HPCFL_DEVICE="cpu")
    deadline = time.monotonic() + 300
    while not list((out / "checkpoints").glob("ckpt-*.h5")):
        assert time.monotonic() < deadline, work.log(jid)
        assert one(cluster.jobs(jid))["JobState"] not in TERMINAL, work.log(jid)
        time.sleep(0.25)
    rec = one(cluster.jobs(jid))
    victim = next(n for n in cluster.nodes[:2] if n != rec["BatchHost"])
    assert rec["NodeList"] == "hpcfl-n[1-2]" and rec["BatchHost"] != victim, rec
    try:
        cluster.kill_node(victim)
        t0 = time.monotonic()
        cluster.wait(jid, lambda rs: rs[0]["JobState"] != "RUNNING" or int(rs[0]["Restarts"]) > 0, LOST_BOUND_S,
                     "out of its attempt after a node was lost", work.log_path(jid))
        took = time.monotonic() - t0
        ckpts = sorted((out / "checkpoints").glob("ckpt-*.h5"))   # before the next attempt can write one
        last = int(ckpts[-1].stem.split("-")[1])
        print(f"\nnode {victim} lost after round {last}'s checkpoint: the attempt ended {took:.1f} s later")
        rec = one(cluster.wait_done(jid, timeout=600, log=work.log_path(jid)))
        log = work.log(jid)
        assert (rec["JobState"], rec["ExitCode"], rec["Restarts"]) == ("COMPLETED", "0:0", "1"), log
        assert "DUE TO NODE FAILURE" in log and "attempt 2, out runs/lost" in log, log
        assert victim not in rec["NodeList"], rec
        assert last < LONG_ROUNDS and resumed_rounds(log) == [last], log
        assert [r["JobState"] for r in cluster.completions(jid)][-1] == "COMPLETED"
        assert_same_run(out, long_ref())
    finally:
        cluster.start_node(victim, timeout=120)   # the next tests have all nodes again


# ---- an array over the nodes ---------------------------------------------------------------

def test_array_tasks_run_their_own_points_spread_over_the_nodes(cluster, work):
    """array_sweep.sbatch over the quickstart sweep (3 rounds a point): --array=0-5 as shipped,
    one 1-core rank a task, 2 cores a node: the tasks run on all 3 nodes; task i runs point i
    (its algorithm and seed), and hpcfl report shows all 6 finished."""
    from hpcfl.cli import sweep
    from hpcfl.results import load

    job = work.job_file("sweep.toml", SWEEP, rounds=3)
    jid = work.sbatch("array_sweep", "--ntasks-per-node=1", *ONE_CORE, JOB=job, HPCFL_SWEEP="sq", HPCFL_DEVICE="cpu")
    recs = cluster.wait_done(jid, timeout=600)
    assert sorted(int(r["ArrayTaskId"]) for r in recs) == list(range(6)), recs
    assert {r["NodeList"] for r in recs} == set(cluster.nodes), [r["NodeList"] for r in recs]
    points = sweep.expand(job, []).points
    assert len(points) == 6
    for r in recs:
        i = int(r["ArrayTaskId"])
        log = work.log(jid, i)
        assert (r["JobState"], r["ExitCode"]) == ("COMPLETED", "0:0"), log
        assert f"array task {i}: point {i} of {job}" in log
        point = points[i]
        res = load(work.dir / "runs" / "sweep" / "sq" / point.name)
        assert res.attrs["status"] == "finished"
        cfg = res.attrs["config"]
        values = dict(s.split("=", 1) for s in point.sets)
        assert cfg["algorithm"]["name"] == values["algorithm.name"] and str(cfg["run"]["seed"]) == values["run.seed"]
    p = hpcfl("report", str(work.dir / "runs" / "sweep" / "sq"), "--format", "json", timeout=120)
    assert p.returncode == 0, p.stderr
    runs = [run for group in json.loads(p.stdout) for run in group["runs"]]
    assert sorted(Path(run["path"]).parent.name for run in runs) == sorted(pt.name for pt in points)
    assert all(run["status"] == "finished" and run["rounds"] == 3 for run in runs), runs
