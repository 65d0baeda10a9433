"""TensorBoard event files of runs (``hpcfl export --format tensorboard``), written so that no planted
link redirects them and no one else's file is deleted.

A run folder may be shared or group-writable, and TensorBoard reads every file whose name holds
``tfevents``. The old export removed every ``events.out.tfevents.*`` in ``<run>/tensorboard`` and
wrote there through whatever that name was: a link planted there made it delete and write in the
link's target, and files it had not written were deleted too. So here:

* the folder is reached one component at a time from a folder that exists (the run's folder, or
  the nearest existing folder above ``--out``), each component opened with ``O_NOFOLLOW`` (created
  when missing) and then used only through its descriptor: a link on the way is refused, naming it;
* the events are built in memory and written to a temporary name created exclusively, then
  renamed into place (:func:`hpcfl.io.safefs.write_new`);
* the folder's record, ``.hpcfl-export``, lists the files export wrote there; a rerun replaces
  and removes only those. A folder holding event files that are not in the record is left
  alone: the export refuses it (TensorBoard would show both as one run) before writing any run.

The record is written listing the new names before they exist and trimmed after the old ones are
removed, so a crash at any point leaves nothing export wrote unrecorded.
"""

from __future__ import annotations

import calendar
import io
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import HpcflError
from ..io import safefs
from ..io.rundir import TENSORBOARD
from .fairness import STATS, by_round, fairness

RECORD = ".hpcfl-export"
EVENTS_WORD = "tfevents"            # TensorBoard reads every file whose name holds it
TMP_PREFIX = ".hpcfl-export-"       # export's temporary files: no EVENTS_WORD, so TensorBoard skips them
_DIR_FLAGS = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
OUT_FIX = "give --out a folder of your own (e.g. --out tb)"


# --------------------------------------------------------------------------- what a run gets

def start_time(res) -> float:
    """The run's first start (``/segments``' UTC time) as a Unix time; 0 when unknown."""
    try:
        return float(calendar.timegm(time.strptime(res.segments[0]["started"], "%Y-%m-%dT%H:%M:%SZ")))
    except (IndexError, KeyError, ValueError, TypeError):
        return 0.0


def scalars(res) -> list[tuple[str, int, float, float]]:
    """(tag, step, wall time, value) of every point TensorBoard gets from one run, in write order."""
    m = res.metrics
    rounds = np.asarray(m["round"], dtype=np.int64)
    took = np.nan_to_num(np.asarray(m.get("time_round", np.zeros(rounds.size)), dtype=np.float64))
    wall = dict(zip(rounds.tolist(), (start_time(res) + np.cumsum(took)).tolist()))
    out = []
    for name in sorted(m):
        if name == "round" or np.asarray(m[name]).dtype.kind not in "fiub":
            continue
        values = np.asarray(m[name], dtype=np.float64)
        out += [(f"metrics/{name}", int(r), wall[int(r)], float(v)) for r, v in zip(rounds, values) if np.isfinite(v)]
    if res.client_eval:
        ev_rounds, per = by_round(res.client_eval, "accuracy")
        for r, acc in zip(ev_rounds.tolist(), per):
            f = fairness(acc)
            out += [(f"clients/accuracy_{k}", int(r), wall.get(int(r), 0.0), f[k]) for k in STATS
                    if np.isfinite(f[k])]
    return out


def event_name(res) -> str:
    """The run's event file name: fixed per run, so a rerun replaces it by a rename."""
    return f"events.out.tfevents.{int(start_time(res)):010d}.hpcfl"


def event_bytes(res) -> bytes:
    """The run's whole event file (TFRecord framing by the tensorboard package's RecordWriter): the
    same bytes every time, its first event stamped with the run's start rather than the clock."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    buf = io.BytesIO()
    records = RecordWriter(buf)
    records.write(event_pb2.Event(wall_time=start_time(res), file_version="brain.Event:2").SerializeToString())
    for tag, step, wall, value in scalars(res):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        records.write(event_pb2.Event(wall_time=wall, step=step, summary=summary).SerializeToString())
    return buf.getvalue()


# --------------------------------------------------------------------------- where it goes

@dataclass(frozen=True)
class Target:
    """A run's event folder: ``base``, a folder that exists (reached as its path says), then ``parts``,
    each reached without following a link (export creates the missing ones)."""

    base: Path
    parts: tuple

    @property
    def path(self) -> Path:
        return self.base.joinpath(*self.parts)


def target(run_dir: Path, out=None) -> Target:
    """``<run>/tensorboard``, or under ``out`` the run's path relative to the current folder (an
    absolute path outside it mirrored in full), so that one logdir shows a sweep."""
    if out is None:
        return Target(run_dir, (TENSORBOARD,))
    out = Path(os.path.abspath(out))   # '..' taken away by the text, never by following a link
    try:
        rel = run_dir.relative_to(Path.cwd())
    except ValueError:
        rel = Path(*run_dir.parts[1:])
    parts = [p for p in (out.name, *rel.parts) if p]
    base = out.parent
    while not os.path.lexists(base) and base.parent != base:   # folders above --out that export creates
        parts.insert(0, base.name)
        base = base.parent
    return Target(base, tuple(parts))


def open_folder(t: Target, create: bool) -> int | None:
    """A descriptor of ``t``'s folder, or None when a part is missing and ``create`` is False."""
    try:
        fd = os.open(t.base, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise HpcflError(f"cannot open {t.base} ({exc.strerror or exc}); {OUT_FIX}") from None
    here = t.base
    for name in t.parts:
        here = here / name
        try:
            child = _open_part(fd, name, here, create)
        finally:
            os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


def _open_part(parent: int, name: str, path: Path, create: bool) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as exc:
        raise _not_a_folder(parent, name, path, exc) from None
    try:
        os.mkdir(name, 0o777, dir_fd=parent)   # the umask applies, as for any folder the user makes
    except FileExistsError:   # made meanwhile: opened below, and refused there if it is a link
        pass
    except OSError as exc:
        raise HpcflError(f"cannot create {path} ({exc.strerror or exc}); {OUT_FIX}") from None
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise _not_a_folder(parent, name, path, exc) from None


def _not_a_folder(parent: int, name: str, path: Path, exc: OSError) -> HpcflError:
    """The error for a part of the way that could not be opened as a folder without following a link."""
    try:
        st = os.lstat(name, dir_fd=parent)
    except OSError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        return HpcflError(f"{path} is a symbolic link (to {os.readlink(name, dir_fd=parent)}); hpcfl export never "
                          f"writes through a link. Remove the link (export creates the folder itself), or "
                          f"{OUT_FIX}")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return HpcflError(f"{path} is a file, not a folder, where hpcfl export writes TensorBoard events; move it "
                          f"away, or {OUT_FIX}")
    return HpcflError(f"cannot open {path} ({exc.strerror or exc}); {OUT_FIX}")


# --------------------------------------------------------------------------- the folder's record

def recorded(fd: int, path: Path) -> set[str]:
    """The names export wrote in the open folder ``fd`` (``path``), by its record; empty without one."""
    try:
        text = safefs.read_small(RECORD, limit=1 << 20, dir_fd=fd)
        names = [] if text is None else json.loads(text)["files"]
        if not all(isinstance(n, str) and _plain(n) for n in names):
            raise ValueError("a name in it is not a plain file name")
    except (HpcflError, ValueError, KeyError, TypeError) as exc:
        raise HpcflError(f"{path / RECORD} cannot be read ({exc}); it lists the event files hpcfl export wrote in "
                         f"{path}. Remove it and the event files you know export wrote there, or {OUT_FIX}") from None
    return set(names)


def _plain(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _record(fd: int, names) -> None:
    text = json.dumps({"written_by": "hpcfl export", "files": sorted(names)}, indent=1) + "\n"
    safefs.write_new(RECORD, text.encode(), dir_fd=fd, tmp=f"{TMP_PREFIX}{os.urandom(4).hex()}.tmp")


def foreign(fd: int, path: Path) -> list[str]:
    """Event files in the open folder that export did not write (TensorBoard would read them too)."""
    mine = recorded(fd, path)
    return sorted(n for n in os.listdir(fd) if EVENTS_WORD in n and n not in mine)


def foreign_error(path: Path, names: list[str]) -> HpcflError:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return HpcflError(f"{path} holds TensorBoard event files that hpcfl export did not write ({shown}); it leaves "
                      f"them alone and writes no run, since TensorBoard would show them and the export as one run. "
                      f"Move them away (an export by hpcfl before it recorded its files in {RECORD} looks the "
                      f"same: delete its events.out.tfevents.* by hand), or {OUT_FIX}")


def _remove(fd: int, name: str) -> None:
    """Remove a file export wrote (a link is removed, not followed; a folder put there is left)."""
    try:
        if not stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
            os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------- writing

def check(t: Target) -> None:
    """Raise before anything is written when ``t`` cannot take a run's events: a link or a file on the
    way, an unreadable record, or event files export did not write. Creates nothing."""
    fd = open_folder(t, create=False)
    if fd is None:
        return
    try:
        names = foreign(fd, t.path)
    finally:
        os.close(fd)
    if names:
        raise foreign_error(t.path, names)


def write_run(res, t: Target) -> None:
    """Write ``res``'s events into ``t`` (created as needed), replacing only what export wrote there."""
    fd = open_folder(t, create=True)
    try:
        names = foreign(fd, t.path)   # checked again: the folder may have changed since check()
        if names:
            raise foreign_error(t.path, names)
        old, name = recorded(fd, t.path), event_name(res)
        tmp = f"{TMP_PREFIX}{os.getpid()}-{os.urandom(4).hex()}.tmp"
        _record(fd, old | {name, tmp})   # recorded before they exist: a crash leaves nothing of ours unlisted
        safefs.write_new(name, event_bytes(res), dir_fd=fd, tmp=tmp)
        for stale in old - {name}:
            _remove(fd, stale)
        _record(fd, {name})
        safefs.fsync_dir(fd)
    except OSError as exc:
        raise HpcflError(f"cannot write TensorBoard events to {t.path} ({exc.strerror or exc}); {OUT_FIX} in a "
                         f"writable place") from None
    finally:
        os.close(fd)


def write(results: list, out=None) -> list[Path]:
    """Every run's events (see the module's docstring); the folders written. Every folder is checked
    before the first is written, so a refused one leaves all of them as they were."""
    targets = [target(res.source.parent, out) for res in results]
    for t in targets:
        check(t)
    for res, t in zip(results, targets):
        write_run(res, t)
    return [t.path for t in targets]
