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

import errno
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from pathlib import Path

from ..errors import HpcflError, WriteError
from . import safefs

MARKER = ".hpcfl-run"
# Left in --out by the watchdog when it ended the job (hpcfl/engine/watchdog.py): under srun the
# job's exit code says 137, not 75, and a batch script requeues on this file instead.
STALLED = ".hpcfl-stalled"
WATCHDOG_ROUNDS = ".hpcfl-watchdog-rounds"   # rounds the watchdog ended, remembered across attempts
LOCK = ".hpcfl-lock"
ASIDE_PREFIX = "replaced-"
# The folders ``hpcfl export`` writes inside a run directory (its TensorBoard events): they describe
# that run's results, so ``--force`` sets them aside with it rather than leave them beside a new run.
TENSORBOARD = "tensorboard"
EXPORT_FOLDERS = (TENSORBOARD,)
_held: list = []   # open lock files: held until unlock() or the process ends (released on any exit)
_created: list = []   # folders lock() created for --out, deepest first (abandon() removes them if still empty)


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
    """Raise an input error unless ``path`` is, or can be made, a writable directory (a full
    filesystem: :class:`~hpcfl.errors.WriteError`, exit 74, since the same command works once there is space).

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
        if safefs.is_full(exc):   # not bad input: the same command works once there is space (exit 74)
            raise WriteError(f"{what} {path} cannot be written: the filesystem of {base} is full ({reason}); free "
                             f"space (or quota) there and run the same command again, or choose another "
                             f"directory") from None
        raise HpcflError(f"{what} {path} cannot be written ({base}: {reason}); {fix}") from None


# The names the results writer (io/results.py) builds results.h5 under (new, resumed); a stale file or
# link there is removed when the writer needs the name, a folder cannot be. (The end of a run writes in
# place since schema 3: no "results.h5.final" copy.)
SCRATCH = (".results.h5.new-tmp", ".results.h5.resume-tmp")


def check_scratch(out: Path) -> None:
    """Raise an input error when a folder sits at one of the temporary names of results.h5 in ``out``.

    hpcfl removes a stale file or link there when it needs the name, but never a folder (it may hold
    someone's files); found only when the name is used, it would end the run with the full-disk code
    after every round had trained. So it is refused here, before anything is written.
    """
    for name in SCRATCH:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            raise HpcflError(f"{path} is a folder, where hpcfl writes a temporary copy of results.h5; move it "
                             f"away (or remove it) and run again, or choose another --out")


def lock(out: Path) -> None:
    """Hold an exclusive lock on ``out`` until :func:`unlock` or the end of this process, or raise.

    Two runs writing one ``--out`` at once would rebuild and replace each other's
    ``results.h5``. The lock is taken before the run reads anything in ``out``, creating
    ``out`` if needed (:func:`abandon` removes it again if the run then does not start), so
    two runs started at once into one new ``--out`` cannot both decide to start fresh.
    ``flock`` is released by the kernel when the process ends in any way (SIGKILL included),
    so a killed run never leaves a stale lock. On a filesystem without locking
    (``results.locking = false``) the caller skips this.

    The lock file is opened without following links and must be a regular file with one
    name: a link planted there could otherwise make the run truncate another file.
    """
    for _ in range(3):   # a run that abandons --out may remove the file between our open and our flock
        f = _open_lock(out)
        if f is not None:
            return
    raise HpcflError(f"could not lock {out}: its lock file kept being removed; try again")


def _open_lock(out: Path):
    """One try of :func:`lock`: the held file, or None when the lock file was removed meanwhile."""
    import fcntl

    created = _make_dirs(out)
    path = out / LOCK
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        _undo(created)
        if exc.errno == errno.ELOOP:
            raise HpcflError(f"{path} is a symbolic link; hpcfl does not follow links in a run directory. Remove "
                             f"it (or choose another --out)") from None
        raise _write_failed(path, exc) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        _undo(created)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else "a hard link to another file"
        raise HpcflError(f"{path} is {what}; hpcfl writes its lock there. Remove it (or choose another --out)")
    f = os.fdopen(fd, "r+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read(200).strip() or "another process"
        f.close()
        raise HpcflError(f"{out} is in use by another hpcfl run ({holder}); wait for it to end, or choose "
                         f"another --out") from None
    except OSError as exc:   # e.g. ENOLCK: no locking on this filesystem
        f.close()
        _undo(created)
        raise HpcflError(f"cannot lock {path} ({exc.strerror or exc}); on a filesystem without file "
                         f"locking set results.locking = false") from None
    try:
        same = os.lstat(path).st_ino == st.st_ino
    except FileNotFoundError:
        same = False
    if not same:   # removed (or replaced) between open and flock: this lock guards nothing
        f.close()
        return None
    try:   # who holds it, for the message another run gets
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
        f.flush()
    except OSError as exc:
        try:
            f.close()   # flushes the same bytes again and fails again, but closes the file all the same
        except OSError:
            pass
        if created:   # the folder is ours, and so is the empty lock file in it
            path.unlink(missing_ok=True)
        _undo(created)
        raise _write_failed(path, exc) from None
    _held.append(f)
    _created.extend(created)
    return f


def _write_failed(path: Path, exc: OSError) -> HpcflError:
    """The lock file could not be written: a full filesystem is exit 74 (free space, run again),
    anything else a directory the user cannot write (exit 2)."""
    if safefs.is_full(exc):
        return WriteError(f"cannot write the lock file {path}: the filesystem is full ({exc.strerror or exc}); "
                          f"free space (or quota) there and run the same command again, or choose another --out")
    return HpcflError(f"cannot create the lock file {path} ({exc.strerror or exc}); choose a directory you can "
                      f"write with --out")


def _make_dirs(out: Path) -> list[Path]:
    """Create ``out`` and its missing parents; the folders created, deepest first."""
    made, p = [], out
    while not p.exists() and not p.is_symlink() and p.parent != p:
        made.append(p)
        p = p.parent
    for d in list(reversed(made)):
        try:
            d.mkdir()
        except FileExistsError:   # another run made it meanwhile: not ours to remove
            made.remove(d)
        except OSError as exc:
            _undo([m for m in made if m.exists()])
            raise HpcflError(f"cannot create {out} ({exc.strerror or exc}); choose a directory you can write "
                             f"with --out") from None
    return made


def _undo(created: list[Path]) -> None:
    """Remove folders this process created, deepest first, as long as they are empty."""
    for d in created:
        try:
            d.rmdir()
        except OSError:
            return


def abandon() -> None:
    """The run will not start (bad input found after the lock was taken): release the lock, and
    remove ``--out`` again if this process created it and wrote nothing else there."""
    created = list(_created)   # created[0] is --out itself
    unlock()
    if created:
        (created[0] / LOCK).unlink(missing_ok=True)
        _undo(created)


def unlock() -> None:
    """Release and forget every lock this process holds (a finished run, before the next one
    in the same process, e.g. the next point of ``hpcfl sweep``, locks its own ``--out``)."""
    import fcntl

    _created.clear()
    while _held:
        f = _held.pop()
        try:
            fcntl.flock(f, fcntl.LOCK_UN)
        finally:
            f.close()


def holding() -> bool:
    """Whether this process holds a run lock."""
    return bool(_held)


def existing_results(path: Path) -> tuple[str, dict, str | None] | None:
    """(status, stored job, run id) of the results file a run is about to continue, or None.

    Raises an input error for anything hpcfl must not overwrite without ``--force``: a link
    or other non-file, a file that is not an hpcfl results file (no job in it), or a damaged
    one (truncated, unreadable: the message says which). Results files are renamed into
    place whole, so a damaged one is never a run's own half-written file.
    """
    from . import reader
    from .h5check import BadFile

    fix = ("hpcfl does not overwrite it: move it away, choose another --out, or pass --force to set it (and the "
           "run's checkpoints) aside in replaced-<time>/ and start over")
    if path.is_symlink():
        raise HpcflError(f"{path} is a symbolic link (to {os.readlink(path)}); {fix}")
    try:
        return reader.status(path)
    except BadFile as exc:
        raise HpcflError(f"{exc}; {fix}") from None


def read_marker(directory: Path) -> dict | None:
    """The ownership record of a checkpoint directory, or None when it has none."""
    try:
        text = safefs.read_small(directory / MARKER)
        return None if text is None else json.loads(text)
    except (OSError, ValueError, HpcflError) as exc:
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
    text = json.dumps({"run_id": run_id, "results": str(results.resolve()),
                       "claimed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    safefs.write_new(directory / MARKER, text.encode())   # through a fresh, exclusively created name


def set_aside(out: Path, files: list[Path]) -> Path | None:
    """Move ``files`` (the old run's results, export folders and checkpoints) into
    ``out/replaced-<UTC time>/``.

    Returns the new folder, or None when there was nothing to move. What sits in ``out`` keeps its
    name there (``results.h5``, ``tensorboard/``); checkpoints go to its ``checkpoints/``
    sub-folder, so the old run stays whole and can be moved back by hand. A link is moved as the
    link (a rename), never followed, and a dangling one is moved too.
    """
    files = [f for f in files if os.path.lexists(f)]
    if not files:
        return None
    aside = out / f"{ASIDE_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    (aside / "checkpoints").mkdir(parents=True)
    for f in files:
        dest = aside / f.name if f.parent == out else aside / "checkpoints" / f.name
        shutil.move(str(f), str(dest))
    return aside


STALL_NOTE_ENV = "HPCFL_STALL_NOTE"   # set by slurm/hpcfl_srun.sh: where its attempt's note goes
ATTEMPT_ENV = "HPCFL_ATTEMPT"         # set by slurm/hpcfl_srun.sh: a token for each launch


def stall_marker(out: Path) -> Path:
    """Where the watchdog says that it ended a run in ``out``: the launcher's path when it gives
    one (``$OUT/.hpcfl-stalled`` for a run and for every point of a sweep), else ``out/``:data:`STALLED`."""
    given = os.environ.get(STALL_NOTE_ENV)
    return Path(given) if given else Path(out) / STALLED


def stall_header(run_id: str) -> str:
    """The note's first line: which launch (``HPCFL_ATTEMPT``) and which run wrote it. The
    launcher accepts a note only when it names the launch it just made (slurm/hpcfl_srun.sh)."""
    return f"hpcfl-stalled attempt={os.environ.get(ATTEMPT_ENV, '')} run={run_id}"


def clear_stall(out: Path) -> None:
    """A run starts in ``out``: an earlier attempt's :data:`STALLED` there no longer describes it
    (the launcher clears its own note before each launch)."""
    safefs.remove_stale(Path(out) / STALLED)
