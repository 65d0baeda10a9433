"""A Slurm cluster on this machine for the tests: munged, slurmctld and slurmd from Debian's
packages (slurm-wlm 22.05, munge), everything under one temporary directory, torn down after.
One node: slurmd on localhost. Several (``Cluster(d, nodes=3)``): one slurmd per node, each in its
own network, UTS, mount, IPC and PID namespaces on a bridge (tests/e2e/netns_nodes.py), with
``NodeAddr`` per node, slurmctld on the bridge's address (it and the clients, through
:meth:`Cluster._run`, in the bridge's namespace), spool, log and pid files per node
(``%n``); :meth:`Cluster.kill_node` loses a node, :meth:`Cluster.start_node` brings it back.

Nothing here touches the system's Slurm or MUNGE set-up: the daemons get their own key, socket,
ports, state and spool directories, and the clients find them through ``SLURM_CONF``. Every wait
is bounded; a daemon that does not come up raises :class:`ClusterUnavailable` with its log. The
daemons get SIGTERM when the process that started them dies (a test run killed by its timeout
leaves none behind).

The configuration (``SLURM_CONF`` below), and why:

- one node with this machine's CPUs and memory (``slurmd -C``), ``select/cons_tres`` with
  ``CR_Core_Memory``: sbatch checks the templates' cores and ``--mem-per-cpu`` as a site would,
  and refuses their GPU requests (no GPUs here), as a CPU-only site would;
- ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``: no cgroups needed (``srun``
  then says "cluster configuration lacks support for cpu binding" and runs unbound);
- ``MpiDefault=none``, the default of many sites: a template must ask ``srun`` for PMI itself;
- short timers, so the tests do not wait on the scheduler: a requeued job may start again only
  ``cred_expire`` seconds after its requeue (default 120 s), the main scheduling loop runs
  every ``sched_interval`` seconds (default 60 s); ``MinJobAge`` keeps finished jobs visible to
  ``scontrol`` for the whole session;
- ``FirstJobId`` from the test process's pid: two clusters on one machine (the one-node and the
  multi-node test files under pytest-xdist) never both have a job 1.0; when they had, one rank of
  the one-node job failed MPI_Init (UCX "failed to unpack address, invalid bandwidth 0.00";
  presumably state keyed by the PMI job and step ID) and the other waited for ever;
- ``jobcomp/filetxt``: without slurmdbd there is no ``sacct``; the job completion log has a
  record per attempt (``JobState=PENDING`` for a requeued one) with the final state and exit code.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from netns_nodes import NetworkUnavailable, Nodes

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")
PACKAGES = "slurmctld slurmd slurm-client munge iproute2"   # Debian 12: Slurm 22.05; ip for several nodes
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}
# Reasons a pending job gives when it can never start on this cluster: fail at once, not at the timeout.
NEVER = {"PartitionTimeLimit", "PartitionNodeLimit", "PartitionConfig", "ReqNodeNotAvail", "BadConstraints",
         "Resources_Unavailable", "InvalidQOS", "InvalidAccount", "JobHeldAdmin", "JobHeldUser",
         "DependencyNeverSatisfied"}

SLURM_CONF = """\
ClusterName=hpcfltest
SlurmctldHost={host}({ctld_addr})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket,cred_expire={cred_expire}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={d}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/log/jobcomp.log
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval={sched_interval}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
JobRequeue=1
FirstJobId={first_job_id}
MinJobAge={min_job_age}
KillWait={kill_wait}
InactiveLimit=0
MessageTimeout=10
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout={slurmd_timeout}
{node_lines}PartitionName=test Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
"""


class ClusterUnavailable(RuntimeError):
    """The cluster cannot be started here; the message says why (for pytest.skip or a failure)."""


def _sbin_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def missing_tools() -> list[str]:
    return [t for t in DAEMONS + CLIENTS if shutil.which(t, path=_sbin_path()) is None]


def version() -> str:
    """``slurm-wlm 22.05.8``: what ``sbatch --version`` says."""
    return subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": _sbin_path()}).stdout.strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hardware() -> str:
    """This machine's CPU layout as slurmd sees it (``slurmd -C``), e.g. ``CPUs=2 Boards=1 ...``."""
    try:
        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "PATH": _sbin_path()}).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterUnavailable(f"slurmd -C failed: {exc}") from None
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
    found = dict(re.findall(r"(\w+)=(\S+)", out))
    if not all(k in found for k in keys):
        raise ClusterUnavailable(f"slurmd -C did not print the CPU layout: {out!r}")
    return " ".join(f"{k}={found[k]}" for k in keys)


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ClusterUnavailable("cannot read MemTotal from /proc/meminfo")


def _die_with_parent(sig=signal.SIGTERM):
    """In the child, before exec: ``sig`` when the process that started it dies (Linux prctl)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def _kill_with_parent():
    """SIGKILL, for a node's ``unshare``: it ignores SIGTERM while it waits for the node, and its
    death (--kill-child) takes every process of the node with it."""
    _die_with_parent(signal.SIGKILL)


def parse_record(line: str) -> dict:
    """``Key=Value Key2=Value2 ...`` (one line of ``scontrol show -o`` or the jobcomp log)."""
    return dict(re.findall(r"(\w+)=(\S*)", line))


class Cluster:
    """munged + slurmctld + slurmd under ``directory``; :meth:`env` is what clients need."""

    def __init__(self, directory: Path, *, nodes: int = 1, share_shm: bool = False, cred_expire=5,
                 sched_interval=2, min_job_age=3600, kill_wait=10, slurmd_timeout=60):
        self.dir = Path(directory)
        # one node: slurmd on localhost, as before; several: one set of namespaces each (netns_nodes)
        self.nodes = ["hpcfl-node"] if nodes == 1 else [f"hpcfl-n{i}" for i in range(1, nodes + 1)]
        self.net = Nodes(self.dir, self.nodes, share_shm=share_shm) if nodes > 1 else None
        self.settings = dict(cred_expire=cred_expire, sched_interval=sched_interval, min_job_age=min_job_age,
                             kill_wait=kill_wait, slurmd_timeout=slurmd_timeout)
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.dir / "slurm.conf"

    @property
    def node(self) -> str:
        """The only node of a one-node cluster (the first of several)."""
        return self.nodes[0]

    # ---- life cycle ------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> "Cluster":
        missing = missing_tools()
        if missing:
            raise ClusterUnavailable(f"{', '.join(missing)} not found: install Slurm and MUNGE "
                                     f"(Debian 12, as root: apt-get install -y {PACKAGES})")
        if os.geteuid() != 0:
            raise ClusterUnavailable("slurmd must run as root to start jobs; run the Slurm tests as root")
        for sub in ("munge", "state", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        (self.dir / "munge").chmod(0o755)   # munged: its socket's folders must be searchable
        (self.dir / "plugstack.conf").write_text("")   # not the system's /etc/slurm/plugstack.conf
        host = socket.gethostname().split(".")[0]
        try:
            if self.net:
                try:
                    self.net.create(host)
                except NetworkUnavailable as exc:
                    raise ClusterUnavailable(str(exc)) from None
            hardware, mem_mb = _hardware(), (_mem_mb() - 512) // len(self.nodes)
            addr = self.net.addr if self.net else (lambda node: "127.0.0.1")
            node_lines = "".join(f"NodeName={n} NodeAddr={addr(n)} {hardware} RealMemory={mem_mb} State=UNKNOWN\n"
                                 for n in self.nodes)
            self.conf.write_text(SLURM_CONF.format(
                host=host, ctld_addr=self.net.bridge_addr if self.net else "127.0.0.1", d=self.dir,
                node_lines=node_lines, nodes=",".join(self.nodes), ctld_port=_free_port(), d_port=_free_port(),
                first_job_id=1000 * (1 + os.getpid() % 60000) + 100 * len(self.nodes),
                **self.settings))
            self._start_munge(timeout)
            self._spawn("slurmctld", self._in_switch(["slurmctld", "-D", "-f", str(self.conf)]))
            self._wait(lambda: "UP" in self._out("scontrol", "ping"), timeout, "slurmctld")
            for n in self.nodes:
                self.start_node(n, timeout=None)
            self.wait_nodes("idle", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, node: str, timeout: float | None = 60):
        """Start (or restart, after :meth:`kill_node`) the node's slurmd; with a timeout, wait until
        Slurm has it back (idle)."""
        argv = ["slurmd", "-D", "-N", node, "-f", str(self.conf)]
        if self.net:
            self._spawn(f"slurmd-{node}", self.net.command(node, argv), on_parent_death=_kill_with_parent)
        else:
            self._spawn(f"slurmd-{node}", argv)
        if timeout is not None:
            self.wait_nodes("idle", timeout, [node])

    def kill_node(self, node: str):
        """A node lost: SIGKILL to its slurmd and to every process it started (a multi-node cluster:
        the whole PID namespace goes with the ``unshare`` that holds it)."""
        p = self.procs.pop(f"slurmd-{node}")
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)

    def node_states(self) -> dict[str, str]:
        out = self._out("sinfo", "-h", "-N", "-o", "%N %T")
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_nodes(self, state: str, timeout: float, nodes=None):
        nodes = nodes or self.nodes
        self._wait(lambda: all(self.node_states().get(n) == state for n in nodes), timeout,
                   f"nodes {','.join(nodes)} {state}")

    def _start_munge(self, timeout):
        m = self.dir / "munge"
        key = m / "munge.key"
        r = subprocess.run(["mungekey", "--create", f"--keyfile={key}"], capture_output=True, text=True,
                           timeout=30, env=self._daemon_env())
        if r.returncode != 0:
            raise ClusterUnavailable(f"mungekey failed: {r.stderr.strip()}")
        key.chmod(0o600)
        self._spawn("munged", ["munged", "--foreground", "--force", f"--key-file={key}",
                               f"--socket={m / 'munge.socket'}", f"--pid-file={m / 'munged.pid'}",
                               f"--seed-file={m / 'munged.seed'}", f"--log-file={self.dir / 'log' / 'munged.log'}"])
        self._wait(lambda: (m / "munge.socket").exists(), timeout, "munged")

    def _daemon_env(self):
        return {**os.environ, "PATH": _sbin_path(), "SLURM_CONF": str(self.conf)}

    def _spawn(self, name, argv, on_parent_death=_die_with_parent):
        with open(self.dir / "log" / f"{name}.stdout", "w") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                                                env=self._daemon_env(), start_new_session=True,
                                                preexec_fn=on_parent_death)

    def _wait(self, ready, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise ClusterUnavailable(f"{name} exited with {p.returncode} while starting {what}:\n"
                                             f"{self.logs()}")
            if ready():
                return
            time.sleep(0.3)
        raise ClusterUnavailable(f"{what} not ready after {timeout:.0f} s:\n{self.logs()}")

    def stop(self):
        """Cancel every job, wait (bounded) for them to end, then stop the daemons newest first:
        SIGTERM, SIGKILL after 10 s. Never raises."""
        if any(n.startswith("slurmd") and p.poll() is None for n, p in self.procs.items()):
            try:
                ids = self._out("squeue", "-h", "-o", "%A").split()
                if ids:
                    self._run("scancel", *sorted(set(ids)))
                    deadline = time.monotonic() + 30
                    while self._out("squeue", "-h", "-o", "%A").split() and time.monotonic() < deadline:
                        time.sleep(0.5)
            except (OSError, subprocess.SubprocessError):
                pass
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
                except ProcessLookupError:
                    pass
        self.procs.clear()
        if self.net:
            self.net.remove()

    def logs(self, *names, lines=25) -> str:
        files = [self.dir / "log" / n for n in names] or sorted((self.dir / "log").glob("*"))
        parts = []
        for f in files:
            if f.exists():
                tail = f.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"---- {f.name} (last {lines} lines)\n" + "\n".join(tail))
        return "\n".join(parts)

    # ---- clients ---------------------------------------------------------------------------

    def env(self, base=None, **extra) -> dict:
        """A client environment: ``base`` (default os.environ) without Slurm's job variables,
        with this cluster's SLURM_CONF, plus ``extra``."""
        env = {k: v for k, v in (base or os.environ).items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env.update(SLURM_CONF=str(self.conf), PATH=os.pathsep.join([env.get("PATH", ""), "/usr/sbin", "/sbin"]))
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def _in_switch(self, argv: list[str]) -> list[str]:
        """Several nodes: slurmctld and the clients run in the bridge's network namespace."""
        return ["nsenter", f"--net={self.net.switch_path}", *argv] if self.net else list(argv)

    def _run(self, *argv, timeout=30, env=None, cwd=None):
        return subprocess.run(self._in_switch(list(argv)), capture_output=True, text=True, timeout=timeout,
                              env=env or self.env(), cwd=cwd)

    def _out(self, *argv):
        try:
            return self._run(*argv).stdout
        except subprocess.TimeoutExpired:
            return ""

    def sbatch(self, script, *options, cwd, env) -> int:
        """Submit; the job ID (an array's job ID for --array)."""
        p = self._run("sbatch", "--parsable", *options, str(script), cwd=cwd, env=env)
        if p.returncode != 0:
            raise AssertionError(f"sbatch {' '.join(options)} {script} failed ({p.returncode}): {p.stderr}")
        return int(p.stdout.strip().split(";")[0])

    def jobs(self, job_id: int) -> list[dict]:
        """``scontrol show job`` of a job (one record per array task)."""
        out = self._out("scontrol", "show", "job", "-o", str(job_id))
        return [parse_record(line) for line in out.splitlines() if line.startswith("JobId=")]

    def completions(self, job_id: int) -> list[dict]:
        """The job completion log's records of a job, oldest first (array tasks have their own JobId)."""
        log = self.dir / "log" / "jobcomp.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [r for r in map(parse_record, lines) if r.get("JobId") == str(job_id)]

    def wait(self, job_id: int, until, timeout: float, what: str, log: Path | None = None) -> list[dict]:
        """Poll ``scontrol`` every half second until ``until(records)``; on timeout cancel the job
        and fail with its state, its log and the daemons' logs."""
        deadline = time.monotonic() + timeout
        why = f"not {what} after {timeout:.0f} s"
        while time.monotonic() < deadline:
            recs = self.jobs(job_id)
            if recs and until(recs):
                return recs
            stuck = [r.get("Reason") for r in recs if r.get("JobState") == "PENDING" and r.get("Reason") in NEVER]
            if stuck:
                why = f"pending and can never start here (Reason={stuck[0]})"
                break
            time.sleep(0.5)
        recs = self.jobs(job_id)
        self.cancel(job_id)
        text = log.read_text(errors="replace") if log and log.exists() else "(no job log)"
        raise AssertionError(f"job {job_id}: {why}; scontrol: {recs}\n---- job log\n{text[-3000:]}\n"
                             f"{self.logs('slurmctld.log', *(f'slurmd-{n}.log' for n in self.nodes))}")

    def wait_done(self, job_id: int, timeout: float, log: Path | None = None) -> list[dict]:
        """Until every record (array task) of the job is in a final state."""
        return self.wait(job_id, lambda recs: all(r["JobState"] in TERMINAL for r in recs), timeout, "finished",
                         log)

    def signal(self, job_id: int, sig: str, *, batch: bool = False):
        """``scancel --signal=SIG [--batch] JOB``: signal the job's steps (or only its batch shell)."""
        p = self._run("scancel", f"--signal={sig}", *(["--batch"] if batch else []), str(job_id))
        assert p.returncode == 0, p.stderr

    def cancel(self, job_id: int):
        """End the job at once (batch shell and steps), e.g. after a test gave up on it."""
        self._run("scancel", str(job_id))


def cluster_or_skip(directory: Path, what: str, **options):
    """A started :class:`Cluster` for a test fixture (``options`` as the constructor's), or the
    test skipped where one cannot start here; with ``HPCFL_REQUIRE_SLURM=1`` (CI) failed instead.
    ``what`` names it in the messages ("test cluster", "multi-node test cluster")."""
    import pytest

    try:
        return Cluster(directory, **options).start()
    except ClusterUnavailable as exc:
        if os.environ.get("HPCFL_REQUIRE_SLURM") == "1":
            pytest.fail(f"HPCFL_REQUIRE_SLURM=1 but the {what} did not start: {exc}")
        pytest.skip(f"no Slurm {what}: {exc}")
