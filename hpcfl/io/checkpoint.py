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
import os
import shutil
import weakref
from pathlib import Path

import h5py
import numpy as np

from hpcfl.errors import HpcflError
from hpcfl.io import ckptshards, safefs
from hpcfl.io.ckptfile import (_ALLOWED_KINDS, _CALLER_KEYS, _FINAL_RE, _STORE_KEYS, _TEMP_GLOB,  # noqa: F401
                               FORMAT_VERSION, SHARDED_VERSION, Loaded, _check_inputs, _hash_update, _Invalid, _open_h5,
                               _to_json, configure_locking, open_loaded, payload_sha256, read_open, room_for, write_file)
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
        self._owned = {n for n in self._held.names() if _FINAL_RE.match(n) or ckptshards.SHARD_RE.match(n)}

    def _at(self, path: Path) -> Path:
        """``path`` (in this folder) as the held folder's, wherever it now is."""
        return self._held.at(path.name) if self._held is not None else path

    def _names(self) -> list[str]:
        """The names in this folder (the held one's, wherever it now is)."""
        return self._held.names() if self._held is not None else [p.name for p in self.directory.iterdir()]

    def check_folder(self) -> None:
        """Raise :class:`hpcfl.io.heldir.DirectoryMoved` when the folder at the path is no longer the held
        one (swapped since the last save): called before anything is written, by this store or by
        every rank's shard (:func:`hpcfl.engine.shards.write`)."""
        if self._held is not None:
            self._held.verify()

    def path_for(self, round: int) -> Path:
        return self.directory / f"ckpt-{int(round):08d}.h5"

    def list(self):
        """``[(round, path)]`` of all ``ckpt-*.h5`` files, newest first, not verified."""
        names = self._names()
        found = [(int(m.group(1)), self.directory / n) for n in names if (m := _FINAL_RE.match(n))]
        return sorted(found, key=lambda rp: rp[0], reverse=True)

    def clean_temp(self):
        """Delete the temporary files and the shards without a manifest of interrupted saves, and return
        their paths.

        Call it only while no save into this directory runs (e.g. at start-up).
        """
        removed = []
        for p in self.directory.glob(_TEMP_GLOB):
            p.unlink(missing_ok=True)
            removed.append(p)
        return removed + self._sweep_shards()

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
            JSON-serialisable keys; the store sets those in ``_STORE_KEYS``. With ``shards`` (the
            entries :func:`hpcfl.io.ckptshards.write` returned, by rank) and ``shard_token``, this
            file is a sharded checkpoint's manifest: each shard must already be in the folder.

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
            "format_version": SHARDED_VERSION if "shards" in manifest else FORMAT_VERSION,
            "round": round,
            "world_size": int(manifest.pop("world_size")),
            "config_sha256": str(manifest.pop("config_sha256")),
            "versions": _to_json(manifest.pop("versions")),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "payload_sha256": "",   # set by _write, hashed as the blocks go by
            "meta": _to_json(dict(meta or {})),
            **{k: _to_json(v) for k, v in manifest.items()},
        }
        self.check_folder()   # swapped since the last save: stop before touching either folder
        shards = [e["name"] for e in manifest.get("shards", ())]
        self._shards_here(shards)
        final = self.path_for(round)
        tmp = self.directory / f".ckpt-{round:08d}.h5.tmp-{os.getpid()}"
        nbytes = sum(a.nbytes for a in arrays.values())
        if not room_for(self.directory, nbytes):   # HDF5 meeting a full disk can crash at exit: check first
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
            # The manifest alone: each shard was read back and hashed by the rank that wrote it.
            loaded = self._read(self._at(final), keep_arrays=False, shards=False)
            if loaded.manifest["payload_sha256"] != digest:
                raise _Invalid("the stored payload_sha256 is not the one computed while writing")
        except _Invalid as e:
            # The write "succeeded" but the file does not hold what was written (a silent
            # I/O error): delete it so that no restart ever trusts it.
            self._at(final).unlink(missing_ok=True)
            raise HpcflError(f"checkpoint {final} failed verification right after writing ({e}); it was "
                             f"deleted and older checkpoints kept. Check {self.directory} for I/O errors.") from None
        if self._owned is not None:
            self._owned.update([final.name, *shards])
        self._remember(final)
        self._rotate(final)
        return final

    def _write(self, tmp: Path, arrays: dict, attrs: dict) -> str:
        """Write the file; returns the payload_sha256 of what was written (:func:`ckptfile.write_file`)."""
        return write_file(tmp, arrays, attrs)

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
                listed = ckptshards.listed_shards(self._at(path))
                self._at(path).unlink(missing_ok=True)  # beyond the newest `keep` valid ones: the manifest first,
                for name in listed or ():               # so that no checkpoint is ever there without its shards
                    self._at(self.directory / name).unlink(missing_ok=True)
                self._verified.pop(path, None)
            elif path == newest or self._is_valid(path):
                valid += 1
            # A damaged file inside the window stays for inspection until the window
            # moves past it; it never counts towards `keep`.
        self._sweep_shards()

    def _shards_here(self, names: list) -> None:
        """Before a manifest is written: every shard it names is in this folder (the held one). A rank
        whose shard rank 0 does not see wrote into another folder: moved, or not shared by its node."""
        for name in names:
            if not self._at(self.directory / name).is_file():
                raise HpcflError(f"checkpoint shard {name} is not in {self.directory} as rank 0 sees it, though its "
                                 f"rank wrote it there: the checkpoint folder must be one folder that every node "
                                 f"reaches (a shared filesystem, not node-local disk). Set checkpoint.dir to such "
                                 f"a folder, or checkpoint.shards = false to send every row through rank 0. Older "
                                 f"checkpoints were left untouched.")

    def _sweep_shards(self) -> list:
        """Delete this run's shard files that no manifest names (see :func:`ckptshards.debris`)."""
        names = self._names()
        rounds = {int(m.group(1)) for n in names if (m := ckptshards.SHARD_RE.match(n))}
        manifests = {r: (ckptshards.listed_shards(self._at(self.path_for(r))) if self.path_for(r).name in names
                         else ()) for r in rounds}
        gone = []
        for name in ckptshards.debris(names, manifests):
            if self._owned is None or name in self._owned:   # never a file put here since the run began
                self._at(self.directory / name).unlink(missing_ok=True)
                gone.append(self.directory / name)
        return gone

    def _stamp(self, path: Path) -> tuple:
        """(inode, size, mtime_ns) of a checkpoint file, then of each of its round's shards: a change to any
        of them makes it be verified again."""
        st = self._at(path).stat()
        prefix = path.name[:-len(".h5")] + "."
        names = self._names()
        more = []
        for n in sorted(n for n in names if n.startswith(prefix) and ckptshards.SHARD_RE.match(n)):
            try:
                sh = self._at(self.directory / n).stat()
                more.append((n, sh.st_ino, sh.st_size, sh.st_mtime_ns))
            except FileNotFoundError:
                pass
        return (st.st_ino, st.st_size, st.st_mtime_ns, tuple(more))

    def _remember(self, path: Path) -> None:
        self._verified[path] = self._stamp(path)

    def _is_valid(self, path: Path) -> bool:
        try:
            if self._verified.get(path) == self._stamp(path):
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
            loaded.stat = self._verified[path][:3]
            return loaded
        return None

    def _read(self, path: Path, keep_arrays: bool, shards: bool = True) -> Loaded:
        """Open, check and hash one file (and, with ``shards``, every shard a manifest names); raise
        :class:`_Invalid` with the reason to skip it."""
        try:
            with _open_h5(path, "r") as f:
                loaded = self._read_open(f, path, keep_arrays)
            if shards and "shards" in loaded.manifest:   # every shard present, intact and the manifest's
                loaded.shards = ckptshards.verify(path.parent, loaded.manifest, loaded.round, loaded.shapes)
                if keep_arrays:   # the whole checkpoint in memory, as from one file
                    loaded.arrays.update(ckptshards.whole_tables(loaded.shards, loaded.shapes))
            return loaded
        except (_Invalid, MemoryError):
            raise  # a file too big for this node's memory is not a damaged file
        except Exception as e:  # mostly OSError, but a damaged file can make h5py raise anything
            kind = "truncated" if "truncat" in str(e).lower() else "unreadable"
            raise _Invalid(f"{kind}: {type(e).__name__}: {e}") from None

    @staticmethod
    def _read_open(f: h5py.File, path: Path, keep_arrays: bool) -> Loaded:
        return read_open(f, path, keep_arrays)
