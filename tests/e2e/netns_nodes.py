"""Several Slurm "nodes" on one machine, each in its own Linux namespaces, for tests/e2e/slurm_cluster.py.

A node is a network namespace (``ip netns add``) joined to a bridge on a private /24 by a veth
pair; the bridge and slurmctld live in a namespace of their own (the "switch"), so that this
machine's own network gains no interface (an MPI job started outside the cluster meanwhile, e.g.
another test's mpiexec, must not see the bridge: the mpich wheel's UCX failed MPI_Init with
"failed to unpack address, invalid bandwidth 0.00" when it did). Each node has,  for its slurmd and everything slurmd starts (batch shells, srun steps, MPI ranks),
its own UTS (hostname), mount, IPC and PID namespaces, its own ``/etc/hosts`` and a private
``/dev/shm``. So ranks on two nodes share nothing but the file system and the CPUs: MPI has to
move its bytes over the veths, as between real nodes (the tests read the veth counters to check).

Why each piece:

- ``nsenter --net=/run/netns/NODE``, not ``ip netns exec``: the latter remounts ``/sys`` for the
  namespace, which hides ``/sys/fs/cgroup``, and slurmd then refuses to start;
- IPC and PID namespaces and a private ``/dev/shm``: with only network and UTS namespaces, the
  mpich wheel's UCX finds its peer "on the same host" and moves the data through shared memory
  (cross-memory attach needs the peer's PID, SysV segments the IPC namespace, POSIX ones
  ``/dev/shm``): the test would prove nothing about the network;
- ``unshare --kill-child``: the node's processes live exactly as long as the ``unshare`` process
  the test holds. Killing it (:meth:`Nodes.kill`) is a node lost: the kernel kills every process
  of the node's PID namespace at once, slurmd and tasks alike.

Needs root and ``ip`` (iproute2), ``nsenter`` and ``unshare`` (util-linux). :meth:`Nodes.remove`
deletes the namespaces and the bridge; it is safe to call twice and after a failed set-up. What a
test process killed outright left behind goes when the next cluster starts (:func:`remove_stale`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from pathlib import Path

TOOLS = ("ip", "nsenter", "unshare", "mount", "hostname")
# One file per bridge made here: "<pid of the test process> <netns> <netns> ...". A test process
# killed outright (its timeout, kill -9) cannot remove what it made; the next one does.
REGISTRY = Path("/run/hpcfl-test-nodes")


class NetworkUnavailable(RuntimeError):
    """The namespaces or the bridge could not be made here; the message says why."""


def _ip(*argv, check=True):
    p = subprocess.run(["ip", *argv], check=False, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise NetworkUnavailable(f"ip {' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_stale():
    """Delete the namespaces and bridges that test processes no longer alive left behind."""
    for entry in REGISTRY.glob("hfb*") if REGISTRY.is_dir() else []:
        try:
            pid, *namespaces = entry.read_text().split()
        except OSError:
            continue
        if pid.isdigit() and not _alive(int(pid)):
            for ns in namespaces:
                _ip("netns", "del", ns, check=False)
            _ip("link", "del", entry.name, check=False)
            entry.unlink(missing_ok=True)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 under 10.213.0.0/16 that no interface of this machine uses (other clusters of other
    test sessions on the same machine pick their own)."""
    used = _ip("-4", "-o", "addr", "show").stdout
    start = os.getpid() % 250
    for k in range(250):
        net = ipaddress.IPv4Network(f"10.213.{(start + k) % 250}.0/24")
        if f" {net.network_address + 1}/" not in used:
            return net
    raise NetworkUnavailable("no free /24 under 10.213.0.0/16")


class Nodes:
    """``count`` node namespaces named ``names`` on one bridge; :meth:`command` wraps a node's
    daemon in its namespaces."""

    def __init__(self, directory: Path, names: list[str], *, share_shm: bool = False):
        self.dir = Path(directory)
        self.names = list(names)
        self.share_shm = share_shm   # True only to show that the tests notice (a mutation)
        tag = f"{os.getpid() % 100000:05d}{id(self) % 97:02d}"
        self.switch = f"hpcfl-{tag}-switch"                          # the bridge's (and slurmctld's) netns
        self.bridge = f"hfb{tag}"                                   # interface names: 15 chars at most
        self.veth = {n: f"hfv{tag}{i}" for i, n in enumerate(self.names)}
        self.netns = {n: f"hpcfl-{tag}-{n}" for n in self.names}
        self.subnet: ipaddress.IPv4Network | None = None
        self.made: list[tuple[str, str]] = []   # what remove() must undo, in order made

    @property
    def bridge_addr(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def switch_path(self) -> str:
        """For ``nsenter --net=``: slurmctld and the Slurm clients run in the switch's namespace."""
        return f"/run/netns/{self.switch}"

    def addr(self, node: str) -> str:
        return str(self.subnet.network_address + 11 + self.names.index(node))

    def create(self, controller_host: str):
        missing = [t for t in TOOLS if shutil.which(t, path=os.pathsep.join([os.environ.get("PATH", ""),
                                                                           "/usr/sbin", "/sbin"])) is None]
        if missing:
            raise NetworkUnavailable(f"{', '.join(missing)} not found (Debian: apt-get install iproute2 util-linux)")
        remove_stale()
        self.subnet = _free_subnet()
        prefix = self.subnet.prefixlen
        REGISTRY.mkdir(exist_ok=True)
        (REGISTRY / self.bridge).write_text(" ".join([str(os.getpid()), self.switch, *self.netns.values()]))
        sw = self.switch
        try:
            _ip("netns", "add", sw)
            self.made.append(("netns", sw))
            _ip("-n", sw, "link", "set", "lo", "up")
            _ip("-n", sw, "link", "add", self.bridge, "type", "bridge")
            _ip("-n", sw, "addr", "add", f"{self.bridge_addr}/{prefix}", "dev", self.bridge)
            _ip("-n", sw, "link", "set", self.bridge, "up")
            hosts = "127.0.0.1 localhost\n" + f"{self.bridge_addr} {controller_host}\n" + "".join(
                f"{self.addr(n)} {n}\n" for n in self.names)
            for n in self.names:
                ns = self.netns[n]
                _ip("netns", "add", ns)
                self.made.append(("netns", ns))
                _ip("-n", sw, "link", "add", self.veth[n], "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", sw, "link", "set", self.veth[n], "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{self.addr(n)}/{prefix}", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                (self.dir / f"hosts-{n}").write_text(hosts)
        except BaseException:
            self.remove()
            raise

    def command(self, node: str, argv: list[str]) -> list[str]:
        """``argv`` run as the node's only daemon: in its network namespace, with its own hostname,
        mounts, IPC and PID namespaces (``argv`` runs under a bash that is the PID namespace's
        init and reaps orphans), its own /etc/hosts and /dev/shm."""
        shm = "" if self.share_shm else "mount -t tmpfs -o size=512m,mode=1777 hpcfl-shm /dev/shm && "
        script = (f"hostname {node} && mount --bind {self.dir / f'hosts-{node}'} /etc/hosts && {shm}"
                  '{ "$@" & pid=$!; trap \'kill -TERM $pid\' TERM; wait $pid; }')
        return ["nsenter", f"--net=/run/netns/{self.netns[node]}",
                "unshare", "--uts", "--mount", "--ipc", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
                "bash", "-c", script, "node-init", *argv]

    def counters(self) -> dict[str, int]:
        """Bytes each node has sent and received over its veth so far (its switch-side end's rx + tx)."""
        links = {d["ifname"]: d["stats64"] for d in json.loads(_ip("-n", self.switch, "-j", "-s", "link", "show").stdout)}
        return {n: links[v]["rx"]["bytes"] + links[v]["tx"]["bytes"] for n, v in self.veth.items()}

    def remove(self):
        """Delete the namespaces (their veths go with them) and the bridge. Never raises."""
        for kind, name in reversed(self.made):
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        self.made.clear()
        (REGISTRY / self.bridge).unlink(missing_ok=True)
