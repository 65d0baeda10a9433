"""One checkpoint file: its layout, its checksum, what may go in it, and how it is opened.

The format constants, the HDF5 locking choice (:func:`configure_locking`), the payload
checksum (:func:`payload_sha256`), the checks on what a save is given, :class:`Loaded` (a
verified checkpoint) and :func:`open_loaded` (its arrays, to read a block at a time). The
directory of such files, written atomically, verified and rotated, is
:class:`hpcfl.io.checkpoint.CheckpointStore`, which re-exports the public names here.

Layout::

    /               attrs  format_version (int, 1)    round (int, completed rounds)
                           world_size (int)           config_sha256 (str)
                           versions (JSON str)        created (ISO 8601, UTC)
                           payload_sha256 (str)       meta (JSON str, small scalars)
                           further manifest keys (each a JSON str)
    /arrays/<name>  one dataset per array, dtype and shape as saved (bool, int, uint,
                    float, complex; object, string, void and datetime are refused)

``payload_sha256`` is SHA-256 over the arrays in sorted-name order, hashing for each
the UTF-8 line ``json.dumps([name, dtype.str, list(shape)]) + "\\n"`` followed by its
raw C-order bytes: a renamed, retyped or reshaped dataset fails like a flipped bit.
Files are read through h5py datasets only; nothing is ever unpickled. Arrays too large to
hold twice (per-client tables) are written, hashed, verified and read back a block at a
time (:mod:`hpcfl.io.ckptblocks`); the hash is the same as over the whole array.

File locking
------------
HDF5 locks files on open, and on filesystems without lock support (Lustre mounted
without ``flock``, many NFS setups) the open fails with ``unable to lock file``.
Call ``configure_locking(False)`` before the first save or load there: it sets
``HDF5_USE_FILE_LOCKING=FALSE``, which processes started from here inherit, and passes
``locking=False`` to ``h5py.File`` where h5py has that argument. That argument is what counts in
this process: HDF5 (2.0 measured) reads the variable once, when the library starts.
``configure_locking(True)`` removes the variable again. Locking adds no safety
here: one rank writes, and readers open only files renamed into place complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from hpcfl.errors import HpcflError
from hpcfl.io import h5check, safefs
from hpcfl.io.ckptblocks import FileArrays, Streamed, hash_bytes, hash_dataset, header

FORMAT_VERSION = 1       # one file holds the whole checkpoint
SHARDED_VERSION = 2      # a manifest and one shard per rank (hpcfl.io.ckptshards)
_CALLER_KEYS = ("world_size", "config_sha256", "versions")
_STORE_KEYS = ("format_version", "round", "created", "payload_sha256", "meta")
_ALLOWED_KINDS = "biufc"  # bool, int, uint, float, complex: plain numeric HDF5 types
_FINAL_RE = re.compile(r"^ckpt-(\d{8,})\.h5$")
_TEMP_GLOB = ".ckpt-*.tmp-*"
_locking_disabled = False


def configure_locking(enabled: bool) -> None:
    """Turn HDF5 file locking off (``False``) or back to the HDF5 default (``True``).

    See "File locking" in the module docstring.
    """
    global _locking_disabled
    _locking_disabled = not enabled
    if enabled:
        os.environ.pop("HDF5_USE_FILE_LOCKING", None)
    else:
        os.environ["HDF5_USE_FILE_LOCKING"] = "FALSE"


def _open_h5(path: Path, mode: str) -> h5py.File:
    """The one place checkpoint files are opened, so the locking choice applies to all."""
    if _locking_disabled:
        try:
            return h5py.File(path, mode, locking=False)
        except (TypeError, ValueError):
            # h5py < 3.5 (no argument) or HDF5 < 1.10.7 (ValueError): the environment
            # variable set by configure_locking turns locking off all the same.
            pass
    return h5py.File(path, mode)


def _hash_update(h, name: str, arr: np.ndarray) -> None:
    h.update(header(name, arr.dtype, arr.shape))
    hash_bytes(h, arr)


def payload_sha256(arrays: dict) -> str:
    """SHA-256 hex digest of ``arrays`` in the canonical order (see the module docstring)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        _hash_update(h, name, np.asarray(arrays[name]))
    return h.hexdigest()


def _to_json(value) -> str:
    def default(o):
        if isinstance(o, np.generic):  # numpy scalars end up in meta all the time
            return o.item()
        raise TypeError(f"{type(o).__name__} is not JSON serialisable; store arrays in `arrays`, not meta/manifest")

    return json.dumps(value, default=default, sort_keys=True)


def _check_inputs(round, arrays, manifest) -> dict:
    if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 0:
        raise ValueError(f"round must be an integer >= 0 (the number of completed rounds), found {round!r}")
    missing = [k for k in _CALLER_KEYS if k not in manifest]
    if missing:
        raise ValueError(f"manifest is missing {missing}: pass world_size, config_sha256 and versions")
    clash = sorted(set(_STORE_KEYS) & set(manifest))
    if clash:
        raise ValueError(f"manifest keys {clash} are set by the checkpoint store; leave them out")
    out = {}
    for name, a in arrays.items():
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name:
            raise ValueError(f"array name {name!r} is not allowed: use a non-empty string without '/'")
        a = a if isinstance(a, Streamed) else np.asarray(a)
        if a.dtype.kind not in _ALLOWED_KINDS:
            raise TypeError(f"array {name!r} has dtype {a.dtype}: checkpoints hold bool/int/uint/float/complex "
                            f"arrays only and never pickle objects")
        out[name] = a
    return out


class _Invalid(Exception):
    """A checkpoint file to skip; the message is the reason."""


@dataclass
class Loaded:
    """A verified checkpoint, as returned by :meth:`CheckpointStore.load_latest`.

    Attributes
    ----------
    round : int
        Completed rounds.
    arrays : dict of str to np.ndarray
        Bitwise equal to what was saved (0-d arrays come back as 0-d arrays).
    meta : dict
    manifest : dict
        All root attributes except ``meta``, JSON values decoded.
    path : Path
    skipped : list of (Path, str)
        Newer files that failed to load, newest first, with the reason.
    shapes : dict of str to (tuple, np.dtype)
        Every array's shape and dtype (also when ``arrays`` was not kept).
    stat : tuple
        (inode, size, mtime_ns) of the file when it was verified: :func:`open_loaded` reopens
        only that file.
    shards : list of :class:`hpcfl.io.ckptshards.Shard`
        A sharded checkpoint's verified shards, by rank; empty for a checkpoint in one file.
    """

    round: int
    arrays: dict
    meta: dict
    manifest: dict
    path: Path
    skipped: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)
    stat: tuple = ()
    shards: list = field(default_factory=list)


def open_loaded(loaded: Loaded) -> FileArrays:
    """The arrays of checkpoint ``loaded`` (from ``load_latest(keep_arrays=False)``), to read a
    block at a time; close it after. Refuses a file changed since it was verified."""
    try:
        st = loaded.path.stat()
        if (st.st_ino, st.st_size, st.st_mtime_ns) != tuple(loaded.stat):
            raise OSError("it changed since it was verified")
        return FileArrays(_open_h5(loaded.path, "r"))
    except OSError as e:
        raise HpcflError(f"cannot read checkpoint {loaded.path}: {e}; run the same command again to resume "
                         f"from the newest valid checkpoint") from None


@h5check.quiet
def room_for(folder: Path, nbytes: int) -> bool:
    """Whether ``folder``'s filesystem has room for a checkpoint file of ``nbytes`` of arrays and HDF5's
    metadata (True where the free space cannot be read). Checked before writing: HDF5 meeting a full
    disk can crash the process when the file is closed."""
    free = safefs.free_bytes(folder)
    return free is None or free >= nbytes + (64 << 10)


def write_file(tmp: Path, arrays: dict, attrs: dict) -> str:
    """Write, flush and fsync the checkpoint-format file ``tmp`` (created exclusively): ``attrs`` as its root
    attributes, ``arrays`` (np.ndarray or :class:`Streamed`) under /arrays. Returns the payload_sha256 of
    what was written (also stored as the attribute of that name)."""
    # Created exclusively: a link planted under the temporary name is removed, never followed.
    safefs.remove_stale(tmp)
    f = _open_h5(tmp, "w-")
    try:
        f.attrs.update(attrs)
        g = f.create_group("arrays")
        h = hashlib.sha256()
        for name in sorted(arrays):   # the hash's order
            a = arrays[name]
            if isinstance(a, Streamed):
                ds = g.create_dataset(name, shape=a.shape, dtype=a.dtype)
                h.update(header(name, a.dtype, a.shape))
                for r0, r1, rows in a:   # one block in memory at a time
                    ds[r0:r1] = rows
                    hash_bytes(h, rows)
            else:
                g.create_dataset(name, data=a)
                _hash_update(h, name, a)
        digest = f.attrs["payload_sha256"] = h.hexdigest()
        f.flush()
        fd = f.id.get_vfd_handle()  # the sec2 driver's descriptor
        os.fsync(fd)
    except BaseException:
        # After a failed write HDF5 cannot close cleanly either (it tries to extend
        # the file again, and its exit handler would crash the process trying once
        # more); the write error is the one to report, the file is deleted anyway.
        h5check.close_failed(f)
        raise
    try:
        f.close()
    except Exception as e:  # HDF5 reports close failures as RuntimeError
        raise OSError(f"closing the HDF5 file failed: {e}") from e
    # Closing may still write HDF5 bookkeeping (end-of-file address, free space);
    # one more fsync puts that on disk too, and costs nothing when nothing is dirty.
    safefs.fsync(tmp)
    return digest


def read_open(f: h5py.File, path: Path, keep_arrays: bool, shard: bool = False) -> Loaded:
    """Check and hash the open checkpoint file ``f`` (a whole checkpoint, a sharded checkpoint's manifest,
    or with ``shard`` one of its shards); raise :class:`_Invalid` with the reason to skip it. A manifest's
    shards are checked by :func:`hpcfl.io.ckptshards.verify`, not here."""
    attrs = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in f.attrs.items()}
    missing = [k for k in _STORE_KEYS + _CALLER_KEYS if k not in attrs]
    if missing:
        raise _Invalid(f"missing manifest: no root attribute(s) {missing}")
    version = attrs["format_version"]
    if version not in ((SHARDED_VERSION,) if shard else (FORMAT_VERSION, SHARDED_VERSION)):
        raise _Invalid(f"format_version {version!r}, this hpcfl reads {FORMAT_VERSION} and {SHARDED_VERSION}")
    if not shard and (version == SHARDED_VERSION) != ("shards" in attrs):
        raise _Invalid(f"format_version {version} {'without' if version == SHARDED_VERSION else 'with'} a shard list")
    m = _FINAL_RE.match(path.name)
    if m and int(m.group(1)) != attrs["round"]:
        raise _Invalid(f"the file name says round {int(m.group(1))}, the manifest round {attrs['round']}")
    g = f.get("arrays")
    if not isinstance(g, h5py.Group):
        raise _Invalid("no /arrays group")
    h, arrays, shapes = hashlib.sha256(), {}, {}
    for name in sorted(g):
        ds = g[name]
        # Check the type before reading: h5py returns Python objects for string
        # and variable-length types, which no checkpoint contains.
        if not isinstance(ds, h5py.Dataset) or ds.dtype.kind not in _ALLOWED_KINDS:
            raise _Invalid(f"/arrays/{name} is not a numeric dataset")
        if not isinstance(g.get(name, getlink=True), h5py.HardLink):
            raise _Invalid(f"/arrays/{name} is a link to another object or file")
        try:   # no external or virtual storage, nothing larger than the file holds
            h5check.dataset(ds, path, _ALLOWED_KINDS, ndim=None)
        except h5check.BadFile as e:
            raise _Invalid(str(e).replace(f"{path}: ", "")) from None
        shapes[name] = (tuple(ds.shape), ds.dtype)
        if keep_arrays:
            arrays[name] = np.asarray(ds[()])  # a 0-d dataset reads as a numpy scalar
            _hash_update(h, name, arrays[name])
        else:   # a table larger than this node's memory verifies all the same
            hash_dataset(h, name, ds)
    stored, computed = attrs["payload_sha256"], h.hexdigest()
    if computed != stored:
        raise _Invalid(f"checksum mismatch: payload_sha256 {str(stored)[:12]}... stored, "
                       f"{computed[:12]}... computed")
    try:
        meta = json.loads(attrs.pop("meta"))
        for k in set(attrs) - set(_STORE_KEYS) - {"world_size", "config_sha256"}:
            attrs[k] = json.loads(attrs[k])  # versions and the further manifest keys
    except (TypeError, ValueError) as e:
        raise _Invalid(f"manifest JSON unreadable: {e}") from None
    return Loaded(round=int(attrs["round"]), arrays=arrays, meta=meta, manifest=attrs, path=path, shapes=shapes)
