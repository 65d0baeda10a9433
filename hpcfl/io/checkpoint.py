"""Checkpoint store: one self-verifying HDF5 file per checkpoint, ``<dir>/ckpt-<round:08d>.h5``.

A checkpoint counts only once it is complete and verified (as in LLNL SCR), and its
final name appears only after all of its bytes are on disk (as PyTorch DCP renames
its metadata into place last). :meth:`CheckpointStore.save`

1. writes ``<dir>/.ckpt-<round:08d>.h5.tmp-<pid>`` (same directory: the rename
   never crosses a filesystem), flushes HDF5, calls ``os.fsync`` on it, closes it;
2. renames it with ``os.replace`` to ``ckpt-<round:08d>.h5`` (atomic), fsyncs the directory
   so that the new name survives a crash too;
3. reads the file back and recomputes its checksum;
4. only then deletes checkpoints beyond the newest ``keep`` valid ones.

A process killed at any moment leaves the previous checkpoints plus at most one
stray temporary file (ignored when loading, removed by ``clean_temp()``), or the
new complete checkpoint. A failed write (disk full, quota) removes its temporary
file, touches nothing else and raises :class:`~hpcfl.errors.HpcflError`.

The file itself (layout, checksum, file locking, :class:`Loaded`, :func:`open_loaded`) is
:mod:`hpcfl.io.ckptfile`; its public names are re-exported here.
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import json
import os
import shutil
import weakref
from pathlib import Path

import h5py
import numpy as np

from hpcfl.errors import HpcflError
from hpcfl.io import h5check, safefs
from hpcfl.io.ckptblocks import Streamed, hash_bytes, hash_dataset, header
from hpcfl.io.ckptfile import (_ALLOWED_KINDS, _CALLER_KEYS, _FINAL_RE, _STORE_KEYS, _TEMP_GLOB,  # noqa: F401
                               FORMAT_VERSION, Loaded, _check_inputs, _hash_update, _Invalid, _open_h5,
                               _to_json, configure_locking, open_loaded, payload_sha256)
from hpcfl.io.heldir import HeldDir


class CheckpointStore:
    """A directory of round checkpoints with atomic writes, verification and rotation.

    Parameters
    ----------
    directory : str or Path
        Created if missing. Only one process (global rank 0) may save into it.
    keep : int
        How many of the newest valid checkpoints survive each save; at least 2, so a
        checkpoint found damaged later always has a verified predecessor.
    """

    def __init__(self, directory, keep: int = 3):
        if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 2:
            raise ValueError(f"keep must be an integer >= 2, found {keep!r}: with 1, a damaged newest "
                             f"checkpoint would leave nothing to restart from")
        self.directory = Path(directory)
        self.keep = int(keep)
        self.directory.mkdir(parents=True, exist_ok=True)
        # path -> (inode, size, mtime_ns) when this store last verified it, so that a
        # save need not re-read all kept checkpoints to count the valid ones.
        self._verified: dict = {}
        self.last_skipped: list = []  # the skipped files of the last load_latest()
        self._held = None    # HeldDir once hold() was called: a live run's folder (hpcfl/io/heldir.py)
        self._owned = None   # names rotation may delete once held: there at hold(), or written since

    def hold(self) -> None:
        """A live run takes the folder (after checking it is its own): from now on every operation
        goes through a descriptor held open, each save first checks that the folder at the path is
        still this one (else :class:`hpcfl.io.heldir.DirectoryMoved`), and rotation deletes only
        checkpoints that were there now or that this store wrote."""
        self._held = HeldDir(self.directory)
        weakref.finalize(self, self._held.close)   # a sweep runs many stores in one process
        self._owned = {n for n in self._held.names() if _FINAL_RE.match(n)}

    def _at(self, path: Path) -> Path:
        """``path`` (in this folder) as the held folder's, wherever it now is."""
        return self._held.at(path.name) if self._held is not None else path

    def path_for(self, round: int) -> Path:
        return self.directory / f"ckpt-{int(round):08d}.h5"

    def list(self):
        """``[(round, path)]`` of all ``ckpt-*.h5`` files, newest first, not verified."""
        names = self._held.names() if self._held is not None else [p.name for p in self.directory.iterdir()]
        found = [(int(m.group(1)), self.directory / n) for n in names if (m := _FINAL_RE.match(n))]
        return sorted(found, key=lambda rp: rp[0], reverse=True)

    def clean_temp(self):
        """Delete the temporary files of interrupted saves and return their paths.

        Call it only while no save into this directory runs (e.g. at start-up).
        """
        removed = []
        for p in self.directory.glob(_TEMP_GLOB):
            p.unlink(missing_ok=True)
            removed.append(p)
        return removed

    # ------------------------------------------------------------------ save
    def save(self, round: int, arrays: dict, meta: dict | None = None, manifest: dict | None = None) -> Path:
        """Write, verify, then rotate in the checkpoint taken after ``round`` completed rounds.

        Parameters
        ----------
        round : int
            Completed rounds (>= 0); names the file.
        arrays : dict of str to np.ndarray
            Numeric arrays of any shapes; names without ``/``. A
            :class:`~hpcfl.io.ckptblocks.Streamed` is written and hashed a block at a time as
            its iterator gives them (never whole in memory); a caller whose streams are fed by
            other processes drains them whatever this raises.
        meta : dict, optional
            Small JSON-serialisable values (simulated clock, counters).
        manifest : dict
            ``world_size``, ``config_sha256``, ``versions`` and any further
            JSON-serialisable keys; the store sets those in ``_STORE_KEYS``.

        Returns
        -------
        Path
            The final file.

        Raises
        ------
        TypeError or ValueError
            A non-numeric array (nothing is pickled), a bad round, name or manifest.
        HpcflError
            The write failed (disk full, quota, I/O) or did not verify; older
            checkpoints are untouched and no temporary file is left.
        """
        manifest = dict(manifest or {})
        arrays = _check_inputs(round, arrays, manifest)
        round = int(round)
        attrs = {
            "format_version": FORMAT_VERSION,
            "round": round,
            "world_size": int(manifest.pop("world_size")),
            "config_sha256": str(manifest.pop("config_sha256")),
            "versions": _to_json(manifest.pop("versions")),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "payload_sha256": "",   # set by _write, hashed as the blocks go by
            "meta": _to_json(dict(meta or {})),
            **{k: _to_json(v) for k, v in manifest.items()},
        }
        if self._held is not None:
            self._held.verify()   # swapped since the last save: stop before touching either folder
        final = self.path_for(round)
        tmp = self.directory / f".ckpt-{round:08d}.h5.tmp-{os.getpid()}"
        nbytes = sum(a.nbytes for a in arrays.values())
        free = safefs.free_bytes(self.directory)
        if free is not None and free < nbytes + (64 << 10):   # HDF5 meeting a full disk can crash at exit: check first
            raise HpcflError(self._write_error(round, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), nbytes))
        try:
            digest = self._write(self._at(tmp), arrays, attrs)
            os.replace(self._at(tmp), self._at(final))
            if self._held is not None:
                self._held.fsync()
            else:
                safefs.fsync(self.directory, directory=True)
        except BaseException as e:
            # Whatever went wrong, a half-written file must not stay behind and eat the
            # space that the next attempt needs.
            self._at(tmp).unlink(missing_ok=True)
            if isinstance(e, (OSError, RuntimeError)):   # HDF5 reports some failed writes as RuntimeError
                raise HpcflError(self._write_error(round, e, nbytes)) from e
            raise
        try:
            loaded = self._read(self._at(final), keep_arrays=False)
            if loaded.manifest["payload_sha256"] != digest:
                raise _Invalid("the stored payload_sha256 is not the one computed while writing")
        except _Invalid as e:
            # The write "succeeded" but the file does not hold what was written (a silent
            # I/O error): delete it so that no restart ever trusts it.
            self._at(final).unlink(missing_ok=True)
            raise HpcflError(f"checkpoint {final} failed verification right after writing ({e}); it was "
                             f"deleted and older checkpoints kept. Check {self.directory} for I/O errors.") from None
        if self._owned is not None:
            self._owned.add(final.name)
        self._remember(final)
        self._rotate(final)
        return final

    @h5check.quiet
    def _write(self, tmp: Path, arrays: dict, attrs: dict) -> str:
        """Write the file; returns the payload_sha256 of what was written."""
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

    def _write_error(self, round: int, e: Exception, nbytes: int) -> str:
        if getattr(e, "errno", None):
            what = f"{os.strerror(e.errno)} ({errno.errorcode.get(e.errno, 'errno ' + str(e.errno))})"
        else:  # HDF5 errors may come without errno; the C errno text is in the message
            what = str(e) or type(e).__name__
        try:
            free = f"; {shutil.disk_usage(self.directory).free / 1e6:,.1f} MB are free there now"
        except OSError:
            free = ""
        return (f"cannot write the checkpoint of round {round} to {self.directory}: {what}. It needs about "
                f"{nbytes / 1e6:,.1f} MB ({nbytes:,} bytes) plus a little HDF5 metadata{free}. Free space "
                f"(or quota) there, lower the number of checkpoints kept, or set the checkpoint directory "
                f"to a filesystem with room. Previous checkpoints were left untouched.")

    def _rotate(self, newest: Path) -> None:
        valid = 0
        for _, path in self.list():
            if self._owned is not None and path.name not in self._owned:
                continue   # not this run's (put there since it started): never deleted, never counted
            if valid >= self.keep and path != newest:
                self._at(path).unlink(missing_ok=True)  # beyond the newest `keep` valid ones
                self._verified.pop(path, None)
            elif path == newest or self._is_valid(path):
                valid += 1
            # A damaged file inside the window stays for inspection until the window
            # moves past it; it never counts towards `keep`.

    def _remember(self, path: Path) -> None:
        st = self._at(path).stat()
        self._verified[path] = (st.st_ino, st.st_size, st.st_mtime_ns)

    def _is_valid(self, path: Path) -> bool:
        try:
            st = self._at(path).stat()
            if self._verified.get(path) == (st.st_ino, st.st_size, st.st_mtime_ns):
                return True
            self._read(self._at(path), keep_arrays=False)
        except (_Invalid, OSError):
            return False
        self._remember(path)
        return True

    # ------------------------------------------------------------------ load
    def load_latest(self, keep_arrays: bool = True, below: int | None = None) -> Loaded | None:
        """The newest checkpoint that opens, has a version-1 manifest and matches its checksum.

        Damaged files are skipped and listed in ``Loaded.skipped`` (and in
        ``self.last_skipped``, also when nothing loads). Temporary files are ignored.
        ``keep_arrays=False`` verifies a block at a time and keeps no array (``Loaded.shapes``
        says what is there; :func:`open_loaded` reads it); ``below`` looks only at checkpoints
        of fewer rounds (the fallback past one that does not fit the job).

        Returns
        -------
        Loaded or None
            None when the directory holds no valid checkpoint.
        """
        self.last_skipped = skipped = []
        for rnd, path in self.list():
            if below is not None and rnd >= below:
                continue
            try:
                loaded = self._read(path, keep_arrays=keep_arrays)
            except _Invalid as e:
                skipped.append((path, str(e)))
                continue
            loaded.skipped = skipped[:]
            self._remember(path)  # the first save after a restart need not re-read it
            loaded.stat = self._verified[path]
            return loaded
        return None

    def _read(self, path: Path, keep_arrays: bool) -> Loaded:
        """Open, check and hash one file; raise :class:`_Invalid` with the reason to skip it."""
        try:
            with _open_h5(path, "r") as f:
                return self._read_open(f, path, keep_arrays)
        except (_Invalid, MemoryError):
            raise  # a file too big for this node's memory is not a damaged file
        except Exception as e:  # mostly OSError, but a damaged file can make h5py raise anything
            kind = "truncated" if "truncat" in str(e).lower() else "unreadable"
            raise _Invalid(f"{kind}: {type(e).__name__}: {e}") from None

    @staticmethod
    def _read_open(f: h5py.File, path: Path, keep_arrays: bool) -> Loaded:
        attrs = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in f.attrs.items()}
        missing = [k for k in _STORE_KEYS + _CALLER_KEYS if k not in attrs]
        if missing:
            raise _Invalid(f"missing manifest: no root attribute(s) {missing}")
        if attrs["format_version"] != FORMAT_VERSION:
            raise _Invalid(f"format_version {attrs['format_version']!r}, this hpcfl reads {FORMAT_VERSION}")
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
