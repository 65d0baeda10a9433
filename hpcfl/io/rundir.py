"""A run's directories: path checks, checkpoint-directory ownership, ``--force`` set-aside.

Three rules keep results and checkpoints from being lost (docs/reliability.md):

* every path problem is found before anything is written or moved, and reported as an
  input error naming the path and the fix (:func:`check_writable`);
* a checkpoint directory belongs to one run: a marker file holds that run's id and its
  results file, and another run is refused (:func:`claim`), so rotation or ``--force`` in
  one run never touches another run's checkpoints;
* ``--force`` moves the old run aside instead of deleting it (:func:`set_aside`); the
  caller deletes the set-aside copy only once the new run has written a verified
  checkpoint, so a new run that dies early leaves the old one recoverable.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from ..errors import HpcflError

MARKER = ".hpcfl-run"
LOCK = ".hpcfl-lock"
ASIDE_PREFIX = "replaced-"
_held: list = []   # open lock files: held until unlock() or the process ends (released on any exit)


def new_run_id() -> str:
    """A fresh run id (32 hex digits), written to results.h5 and the checkpoint marker."""
    return uuid.uuid4().hex


def _existing_ancestor(path: Path) -> Path:
    p = path
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def check_writable(path: Path, what: str, fix: str) -> None:
    """Raise an input error unless ``path`` is, or can be made, a writable directory.

    Nothing is created: the nearest existing ancestor must be a directory in which a
    file can be created (tried with a temporary file that is removed at once, because
    permission bits say nothing for root or on a read-only mount).

    Parameters
    ----------
    path : directory that will be created or written
    what : how the message names it, e.g. "--out"
    fix : the remedy the message offers
    """
    if path.exists() and not path.is_dir():
        raise HpcflError(f"{what} {path} is a file, not a directory; {fix}")
    base = _existing_ancestor(path)
    if not base.is_dir():
        raise HpcflError(f"{what} {path}: {base} is a file, so the directory cannot be created; {fix}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".hpcfl-probe-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise HpcflError(f"{what} {path} cannot be written ({base}: {reason}); {fix}") from None


def lock(out: Path) -> None:
    """Hold an exclusive lock on ``out`` until :func:`unlock` or the end of this process, or raise.

    Two runs writing one ``--out`` at once would rebuild and replace each other's
    ``results.h5``. ``flock`` is released by the kernel when the process ends in any way
    (SIGKILL included), so a killed run never leaves a stale lock. On a filesystem without
    locking (``results.locking = false``) the caller skips this.
    """
    import fcntl

    f = open(out / LOCK, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise HpcflError(f"{out} is in use by another hpcfl run ({holder}); wait for it to end, or choose "
                         f"another --out") from None
    except OSError as exc:   # e.g. ENOLCK: no locking on this filesystem
        f.close()
        raise HpcflError(f"cannot lock {out / LOCK} ({exc.strerror or exc}); on a filesystem without file "
                         f"locking set results.locking = false") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
    f.flush()
    _held.append(f)


def unlock() -> None:
    """Release and forget every lock this process holds (a finished run, before the next one
    in the same process, e.g. the next point of ``hpcfl sweep``, locks its own ``--out``)."""
    import fcntl

    while _held:
        f = _held.pop()
        try:
            fcntl.flock(f, fcntl.LOCK_UN)
        finally:
            f.close()


def holding() -> bool:
    """Whether this process holds a run lock."""
    return bool(_held)


def read_marker(directory: Path) -> dict | None:
    """The ownership record of a checkpoint directory, or None when it has none."""
    try:
        return json.loads((directory / MARKER).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise HpcflError(f"{directory / MARKER} cannot be read ({exc}); it records which run owns "
                         f"{directory}: delete it only if no other run uses that directory") from None


def check_owner(directory: Path, run_id: str | None, results: Path) -> None:
    """Raise unless ``directory`` is unclaimed or claimed by this run.

    This run is ``run_id`` (None for a fresh run, which has no id yet) writing ``results``.
    A fresh run may take over a directory whose marker names its own results file (the
    same ``--out`` started over).
    """
    marker = read_marker(directory)
    if marker is None:
        return
    ours = (run_id is not None and marker.get("run_id") == run_id) or \
        (run_id is None and marker.get("results") == str(results.resolve()))
    if not ours:
        raise HpcflError(f"checkpoint directory {directory} belongs to another run (the one writing "
                         f"{marker.get('results')}, run id {marker.get('run_id')}); give this run its own "
                         f"checkpoint.dir (or leave it unset for <out>/checkpoints). If that run is gone, "
                         f"delete {directory / MARKER}")


def claim(directory: Path, run_id: str, results: Path) -> None:
    """Write the marker that makes ``directory`` this run's (creating the directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{MARKER}.tmp"
    tmp.write_text(json.dumps({"run_id": run_id, "results": str(results.resolve()),
                               "claimed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    os.replace(tmp, directory / MARKER)


def set_aside(out: Path, files: list[Path]) -> Path | None:
    """Move ``files`` (the old run's results and checkpoints) into ``out/replaced-<UTC time>/``.

    Returns the new folder, or None when there was nothing to move. Checkpoints go to its
    ``checkpoints/`` sub-folder, so the old run stays whole and can be moved back by hand.
    """
    files = [f for f in files if f.exists()]
    if not files:
        return None
    aside = out / f"{ASIDE_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    (aside / "checkpoints").mkdir(parents=True)
    for f in files:
        dest = aside / f.name if f.parent == out else aside / "checkpoints" / f.name
        shutil.move(str(f), str(dest))
    return aside
