"""A disk cache for generated datasets, keyed by everything that determines them.

Generating workload W's 60,000 CIFAR-shaped images takes seconds on every rank at every
start; mapping them back from ``.npy`` files takes milliseconds. Only
datasets that are pure functions of (name, options, seed) are cached (``DatasetSpec.cache``),
as one folder of ``.npy`` files per entry, mapped (not read) on load:
the key is a hash of those and of :data:`VERSION`, which changes whenever a generator's
output would, so a stale file can never be read for a new recipe.

Where: ``data.cache`` in the job file. ``"auto"`` (the default) is ``$HPCFL_CACHE_DIR``, else
``$XDG_CACHE_HOME/hpcfl``, else ``~/.cache/hpcfl``; ``"off"`` disables it; anything else is a
folder. An entry is written to a temporary folder and renamed into place, so ranks (or jobs)
that generate the same dataset at once leave one whole entry, never a torn one. An entry
that cannot be read is regenerated and replaced; a folder that cannot be written only
costs the speed-up (a message says so).

Content check: ``meta.json`` records each file's SHA-256, size and stamp (inode,
modification and change time) as written. On load a file whose stamp is unchanged is
trusted at no cost (any write to it moves its change time, which no tool can set back); any
other file is hashed (about 1.3 s per 700 MB), and a mismatch, a missing file or an entry
without hashes (an older hpcfl's) makes the entry be generated again and replaced, with a
message naming it: an edited cache never changes results silently. A file that hashes right
after it was copied or restored gets its new stamp recorded in ``verified.json``. The labels
are also checked against the class count and the arrays against each other.

Ownership: the hashes catch damage, not a planted entry (whoever can write the folder writes
``meta.json`` too). So an entry is read or written only when the cache root, ``datasets/`` and
the entry's folder and files are owned by this user (or root) and not writable by group or
others (:func:`hpcfl.native.cachedir.private_folder`; the folders hpcfl creates are 0700);
otherwise a message names the folder and the fix, and the data is generated for this run only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..native import cachedir
from ..signals import stop_requested
from .container import Dataset

VERSION = 1   # bump when any cached generator's output changes


def key(name: str, options, seed: int) -> str:
    """16 hex digits of SHA-256 over (version, name, options, seed)."""
    opts = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else repr(options)
    text = json.dumps({"v": VERSION, "name": name, "options": opts, "seed": int(seed)}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def path_for(root: Path, name: str, options, seed: int) -> Path:
    """The entry's folder: one ``.npy`` file per array and ``meta.json``."""
    return root / "datasets" / f"{name}-{key(name, options, seed)}"


def load_or_make(root: Path | None, name: str, options, seed: int, make) -> Dataset:
    """The dataset from the cache, or ``make()`` (then stored). ``root`` None: always ``make()``."""
    if root is None:
        return make()
    path = path_for(root, name, options, seed)
    try:
        cachedir.private_folder(root, path.parent.name)   # the root and datasets/, before anything is read
        if path.exists():
            cachedir.check(path)
    except cachedir.UntrustedFolder as err:   # never read from, never written to
        return _untrusted(err, make)
    except OSError as err:   # cannot be created or looked at: only the speed-up is lost
        print(f"hpcfl: could not write the dataset cache {path.parent} ({err}); set data.cache = 'off' or a "
              f"writable folder to silence this", flush=True)
        return make()
    damaged = False
    if path.exists():
        try:
            return _read(path)
        except cachedir.UntrustedFolder as err:   # a file in it someone else could have written: as a folder
            return _untrusted(err, make)
        except (OSError, ValueError, KeyError, TypeError) as err:
            damaged = True
            print(f"hpcfl: dataset cache entry {path} is unreadable or does not match what was cached ({err}); "
                  f"generating the data again", flush=True)
    ds = make()
    if stop_requested():   # stopping: the cache write (hundreds of MB) can wait for the next run
        return ds
    try:
        if _write(path, ds, replace=damaged):
            mb = sum(f.stat().st_size for f in path.iterdir()) / 2**20
            print(f"hpcfl: cached the generated dataset in {path} ({mb:.0f} MB) for later runs; delete the folder to "
                  f"reclaim the space, or set data.cache = 'off'", flush=True)
            # the entry, mapped, instead of the arrays just made: their pages are then the file's, which the
            # node's other ranks map too, where the generated arrays were this process's own (960 MB against
            # 562 MB a rank at 1M clients)
            try:
                return _read(path)
            except (OSError, ValueError, KeyError, TypeError, cachedir.UntrustedFolder):
                return ds
    except OSError as err:
        print(f"hpcfl: could not write the dataset cache {path} ({err}); set data.cache = 'off' or a writable "
              f"folder to silence this", flush=True)
    return ds


def _untrusted(err: cachedir.UntrustedFolder, make) -> Dataset:
    """``make()``, the entry neither read nor replaced (someone else could have written it), said once."""
    if cachedir.first_time(err):
        print(f"hpcfl: the dataset cache is not used: {err}; generating the data for this run only", flush=True)
    return make()


ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def _write(path: Path, ds: Dataset, replace: bool = False) -> bool:
    """Write the entry into a fresh folder, then rename it into place (atomic on POSIX).

    Returns False when another process placed the same entry first (this copy is discarded);
    ``replace`` removes an existing (damaged) entry first.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    arrays = {name: getattr(ds, name) for name in ARRAYS}
    meta = {"name": ds.name, "num_classes": ds.num_classes, "input_shape": list(ds.input_shape),
            "augment": ds.augment, "natural": ds.natural_clients is not None,
            "natural_test": ds.natural_test is not None}
    for key, groups in (("natural", ds.natural_clients), ("natural_test", ds.natural_test)):
        if groups is not None:   # ragged: concatenated, with offsets
            arrays[f"{key}_index"] = np.concatenate(list(groups)).astype(np.int64)
            arrays[f"{key}_offset"] = np.cumsum([0] + [len(c) for c in groups]).astype(np.int64)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    tmp.mkdir(mode=0o700)
    try:
        meta["files"] = {}
        for name, arr in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(arr))
            os.chmod(tmp / f"{name}.npy", 0o644)   # whatever the umask (a group-writable file is refused)
            meta["files"][f"{name}.npy"] = {"sha256": _sha256(tmp / f"{name}.npy"), **_stamp(tmp / f"{name}.npy")}
        (tmp / "meta.json").write_text(json.dumps(meta))   # written last: its presence marks a whole entry
        os.chmod(tmp / "meta.json", 0o644)
        if replace and path.exists():   # a damaged entry (files stay valid for a process that mapped them)
            shutil.rmtree(path)
        try:
            os.replace(tmp, path)       # a reader sees no entry or a whole one
        except OSError:
            if not (path / "meta.json").exists():   # not another process's identical entry, written first
                raise
            return False
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _stamp(path: Path) -> dict:
    """What changes whenever a file's bytes do: size, inode, modification and change time (raises
    UntrustedFolder for a file someone else could have written)."""
    st = os.stat(path)
    why = cachedir.untrusted_because(st)
    if why:
        raise cachedir.UntrustedFolder(f"{path} is {why}")
    return {"size": st.st_size, "stamp": [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]}


def _check_files(path: Path, meta: dict) -> None:
    """Raise ValueError unless every file of the entry is as it was written (see the module docstring)."""
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        raise ValueError("the entry records no content hashes (written by an older hpcfl)")
    try:
        seen = json.loads((path / "verified.json").read_text())
    except (OSError, ValueError):
        seen = {}
    fresh = {}
    for name, rec in files.items():
        now = _stamp(path / name)
        if now == {"size": rec["size"], "stamp": rec["stamp"]} or now == seen.get(name):
            continue
        if now["size"] != rec["size"] or _sha256(path / name) != rec["sha256"]:
            raise ValueError(f"{name} changed since it was cached")
        fresh[name] = now
    if fresh:   # copied or restored, bytes intact: next time the stamp suffices (best effort)
        try:
            tmp = path / f".verified.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            tmp.write_text(json.dumps({**seen, **fresh}))
            os.replace(tmp, path / "verified.json")
        except OSError:
            pass


def _read(path: Path) -> Dataset:
    """Arrays mapped copy-on-write: pages are read when first touched, shared between the ranks
    of a node until one writes, and never written back. Raises ValueError for an entry that
    is not as it was written (hashes), or whose arrays do not fit together."""
    cachedir.check(path / "meta.json")
    meta = json.loads((path / "meta.json").read_text())
    _check_files(path, meta)
    arr = {name: np.load(path / f"{name}.npy", mmap_mode="c", allow_pickle=False) for name in ARRAYS}
    num_classes = int(meta["num_classes"])
    for split in ("train", "test"):
        x, y = arr[f"x_{split}"], arr[f"y_{split}"]
        if len(x) != len(y) or y.ndim != 1 or (y.size and not (0 <= y.min() and y.max() < num_classes)):
            raise ValueError(f"x_{split} and y_{split} do not fit together or the labels leave [0, {num_classes})")
    groups = {}
    for key, split in (("natural", "train"), ("natural_test", "test")):
        groups[key] = None
        if meta.get(key):   # an entry written before natural_test existed has none
            idx = np.load(path / f"{key}_index.npy", allow_pickle=False)
            off = np.load(path / f"{key}_offset.npy", allow_pickle=False)
            if off.ndim != 1 or off[0] != 0 or off[-1] != len(idx) or np.any(np.diff(off) < 0) or \
                    (idx.size and not (0 <= idx.min() and idx.max() < len(arr[f"x_{split}"]))):
                raise ValueError(f"the natural clients' index does not fit the {split} set")
            groups[key] = tuple(idx[off[i] : off[i + 1]] for i in range(len(off) - 1))
    return Dataset(name=meta["name"], num_classes=num_classes, input_shape=tuple(meta["input_shape"]),
                   augment=bool(meta["augment"]), natural_clients=groups["natural"],
                   natural_test=groups["natural_test"], **arr)
