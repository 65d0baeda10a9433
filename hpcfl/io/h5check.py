"""Opening HDF5 files that may be truncated, damaged or crafted, without hanging or trusting them.

Three dangers, each measured on HDF5 2.0 / h5py 3.16:

* **Hangs.** A reader opened with ``swmr=True`` retries every metadata read that fails its
  checksum up to 100 times, sleeping 1 us, 2 us, 4 us ... (capped at one hour) between
  tries, in C, deaf to Ctrl-C: a truncated file held ``hpcfl report`` for hours. So a file
  is opened in SWMR mode only when its superblock says a SWMR writer has it open (a live or
  killed run), the stored end of file is checked against the file's size first (HDF5 skips
  that check for SWMR readers), and where the HDF5 library can be reached the retries are
  bounded to :data:`READ_ATTEMPTS` (about 0.3 s of back-off per failing read).
* **Other files' bytes.** A dataset with external storage reads any file of the machine, a
  virtual dataset reads other HDF5 files, an external or soft link opens other objects:
  :func:`dataset` and :func:`member` refuse them.
* **Sizes.** A chunked dataset of 10^12 never-written rows costs a few bytes on disk and
  terabytes in memory: :func:`dataset` refuses a dataset larger than its file can hold.

Everything wrong is raised as :class:`BadFile`, whose message names the file and the problem.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import stat
import struct
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from ..errors import HpcflError
from ..parallel.exits import exit_handlers_unsafe

SIGNATURE = b"\x89HDF\r\n\x1a\n"
READ_ATTEMPTS = 28          # SWMR metadata read tries: ~0.3 s of back-off per failing read (HDF5: 100, hours)
LIVE_WAIT_S = 2.0           # how long a file marked open by a SWMR writer may trail its stored size
FILTER_FACTOR = 100         # a compressed dataset may be this many times its file's size
_SWMR_WRITE, _WRITE = 0x04, 0x01   # superblock v3 status flags
_lib: list = []             # [ctypes handle or None], looked up once


class BadFile(HpcflError):
    """A results or checkpoint file that is damaged, truncated, or not what it claims to be."""


def _hdf5_library():
    """The HDF5 library h5py uses (for H5Pset_metadata_read_attempts), or None where not found."""
    if not _lib:
        found = None
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "libhdf5" in line and "/" in line}
            for p in sorted(paths):
                if "_hl" not in Path(p).name:
                    lib = ctypes.CDLL(p)   # already mapped by h5py: the same handle
                    lib.H5Pset_metadata_read_attempts.argtypes = [ctypes.c_int64, ctypes.c_uint]
                    found = lib
                    break
        except (OSError, AttributeError):
            found = None
        _lib.append(found)
    return _lib[0]


def _find_signature(fd: int, size: int, path) -> tuple[int, bytes] | None:
    """(offset, the 96 bytes there) of the HDF5 signature in the open file ``fd`` of ``size`` bytes, or
    None. HDF5 looks for it at 0, 512, 1024, 2048, ... (after a user block)."""
    offset = 0
    while True:
        try:
            head = os.pread(fd, 96, offset)
        except OSError as exc:   # EIO from failing storage (or /proc/self/mem): this file's problem
            raise BadFile(f"{path} cannot be read ({exc.strerror or exc})") from None
        if head[:8] == SIGNATURE:
            return offset, head
        offset = 512 if offset == 0 else offset * 2
        if offset >= size:
            return None


def has_signature(path: Path, dir_fd: int | None = None) -> bool:
    """Whether the regular file ``path`` holds an HDF5 signature where HDF5 looks for one (a results
    file, a checkpoint, anyone's HDF5 file, damaged or not).

    A link is not followed (``OSError`` ELOOP) and nothing blocks on a FIFO. Raises ``OSError``
    when the file cannot be opened, BadFile when it cannot be read: the caller cannot tell then.
    ``dir_fd``: ``path`` is a name in that open folder.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and _find_signature(fd, st.st_size, path) is not None
    finally:
        os.close(fd)


def superblock(path: Path) -> dict:
    """The superblock fields that matter here: version, flags, base and stored end of file.

    Raises BadFile for a file that is not a regular HDF5 file (no signature, a directory, a
    FIFO) or too short to hold a superblock.
    """
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BadFile(f"{path} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadFile(f"{path} is not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise BadFile(f"{path} cannot be read ({exc.strerror or exc})") from None
    try:
        found = _find_signature(fd, st.st_size, path)
    finally:
        os.close(fd)
    if found is None:
        raise BadFile(f"{path} is not an HDF5 file (no HDF5 signature)" if st.st_size else f"{path} is empty")
    offset, head = found
    version = head[8]
    try:
        if version in (0, 1):
            osize = head[13]
            flags = struct.unpack_from("<I", head, 20)[0]
            at = 24 + (4 if version == 1 else 0)
        elif version in (2, 3):
            osize, flags, at = head[9], head[11], 12
        else:
            raise BadFile(f"{path}: HDF5 superblock version {version} is unknown to this reader")
        if osize not in (2, 4, 8):
            raise BadFile(f"{path}: damaged HDF5 superblock (offset size {osize})")
        fmt = {2: "<H", 4: "<I", 8: "<Q"}[osize]
        base = struct.unpack_from(fmt, head, at)[0]
        eof = struct.unpack_from(fmt, head, at + 2 * osize)[0]   # after the base and one more address
    except struct.error:
        raise BadFile(f"{path} is truncated (its HDF5 superblock is incomplete)") from None
    return {"version": version, "flags": flags, "base": base, "eof": eof, "size": st.st_size, "offset": offset}


def _swmr_open(sb: dict) -> bool:
    return sb["version"] >= 3 and bool(sb["flags"] & _SWMR_WRITE)


def check_size(path: Path) -> dict:
    """The superblock (see :func:`superblock`) of a file whose size holds what it says it holds.

    A file open in a live SWMR writer may trail its stored end of file for a moment, so such
    a file is looked at again for up to :data:`LIVE_WAIT_S` before it is called truncated.
    """
    deadline = time.monotonic() + LIVE_WAIT_S
    while True:
        sb = superblock(path)
        need = sb["eof"]   # (relative to the base address, which only a user block moves: the lenient reading)
        if sb["eof"] == 2**64 - 1 or need <= sb["size"]:
            return sb
        if not _swmr_open(sb) or time.monotonic() > deadline:
            raise BadFile(f"{path} is truncated: {sb['size']:,} bytes on disk, its HDF5 superblock says "
                          f"{need:,}")
        time.sleep(0.1)


def open_read(path: Path, locking: bool = True) -> h5py.File:
    """Open an HDF5 file read-only, as a SWMR reader only if a SWMR writer has it open.

    Raises BadFile (truncated, not HDF5, damaged metadata); never hangs on a damaged file.
    """
    path = Path(path)
    sb = check_size(path)
    swmr = _swmr_open(sb)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    if not locking and hasattr(fapl, "set_file_locking"):
        fapl.set_file_locking(False, True)
    lib = _hdf5_library()
    if swmr and lib is not None:
        lib.H5Pset_metadata_read_attempts(fapl.id, READ_ATTEMPTS)
    flags = h5py.h5f.ACC_RDONLY | (h5py.h5f.ACC_SWMR_READ if swmr else 0)
    try:
        try:
            fid = h5py.h5f.open(os.fsencode(path), flags, fapl=fapl)
        except OSError as exc:
            # a writer may have opened the file in SWMR mode since the superblock was read
            if swmr or "already open" not in str(exc):
                raise
            if lib is not None:
                lib.H5Pset_metadata_read_attempts(fapl.id, READ_ATTEMPTS)
            fid = h5py.h5f.open(os.fsencode(path), flags | h5py.h5f.ACC_SWMR_READ, fapl=fapl)
        return h5py.File(fid)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise BadFile(f"{path} cannot be opened as HDF5 ({_short(exc)})") from None


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def member(group: h5py.Group, name: str, kind: type, path: Path):
    """``group[name]`` if it is a hard-linked ``kind`` (h5py.Group or h5py.Dataset), else BadFile."""
    where = f"{group.name.rstrip('/')}/{name}"
    try:
        link = group.get(name, getlink=True)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise BadFile(f"{path}: {where} cannot be read ({_short(exc)})") from None
    if link is None:
        raise BadFile(f"{path}: {where} is missing")
    if not isinstance(link, h5py.HardLink):
        raise BadFile(f"{path}: {where} is a {type(link).__name__}, not an object of this file; refused")
    try:
        obj = group[name]
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise BadFile(f"{path}: {where} cannot be read ({_short(exc)})") from None
    if not isinstance(obj, kind):
        raise BadFile(f"{path}: {where} is not a {kind.__name__.lower()}")
    return obj


def dataset(ds: h5py.Dataset, path: Path, kinds: str = "biuf", ndim: int | None = 1) -> h5py.Dataset:
    """``ds`` once its storage, type, rank and size are safe to read; else BadFile.

    Parameters
    ----------
    kinds : numpy dtype kinds accepted ("biuf": numbers; "O"/"S"/"U": strings)
    ndim : the rank required, or None for any
    """
    where = f"{path}: {ds.name}"
    try:
        dcpl = ds.id.get_create_plist()
        if ds.is_virtual:
            raise BadFile(f"{where} is a virtual dataset (its data would come from other files); refused")
        if dcpl.get_external_count() > 0:
            raise BadFile(f"{where} has external storage (its data would come from another file); refused")
        dtype, shape = ds.dtype, ds.shape
        filtered = dcpl.get_nfilters() > 0
    except BadFile:
        raise
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise BadFile(f"{where} cannot be read ({_short(exc)})") from None
    if shape is None:
        raise BadFile(f"{where} holds no data (an empty dataspace)")
    if ndim is not None and len(shape) != ndim:
        raise BadFile(f"{where} has shape {shape}, expected {ndim} dimension(s)")
    string = h5py.check_string_dtype(dtype) is not None
    kind = "O" if string else dtype.kind
    if kind not in kinds or (kind in "biuf" and dtype.fields is not None):
        raise BadFile(f"{where} has type {dtype}, expected {_kinds(kinds)}")
    size = os.path.getsize(path)
    itemsize = 8 if string else dtype.itemsize   # a string's bytes live in the file's heap too
    nbytes = int(np.prod(shape, dtype=np.float64) * itemsize)
    limit = size * (FILTER_FACTOR if filtered else 1) + (1 << 20)   # one chunk of slack
    if nbytes > limit:
        raise BadFile(f"{where} claims {nbytes:,} bytes, more than the {size:,}-byte file can hold; refused")
    return ds


def _kinds(kinds: str) -> str:
    names = {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "O": "strings", "S": "strings",
             "V": "a table"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds if k in names))


def read(ds: h5py.Dataset, path: Path, kinds: str = "biuf", ndim: int | None = 1) -> np.ndarray:
    """The whole of ``ds`` once :func:`dataset` accepts it."""
    dataset(ds, path, kinds, ndim)
    try:
        return ds[()]
    except (OSError, RuntimeError, ValueError, TypeError) as exc:
        raise BadFile(f"{path}: {ds.name} cannot be read ({_short(exc)})") from None


FAILED_WRITE: list = []   # the folders of files whose writes failed in this process (see close_failed)


def close_failed(f: h5py.File) -> None:
    """Close a file whose last write failed (a full disk) without touching it again.

    HDF5 cannot close such a file: its close retries the failed write and fails too, and the
    library's exit handler then crashes the process (SIGSEGV, exit 139) trying once more. So
    the file's descriptor is first pointed at /dev/null: the close "writes" there and
    succeeds, and the file on disk keeps what was flushed before (a killed SWMR writer's
    file, which reads back and resumes). The objects the failed write left open stay in the
    library, which cannot be used safely in this process any more: :data:`FAILED_WRITE` records
    the file, and a new run in the same process is refused (``hpcfl.engine.job``).
    """
    try:
        FAILED_WRITE.append(os.path.dirname(f.filename) or ".")
    except (OSError, RuntimeError, ValueError, TypeError):
        FAILED_WRITE.append("an HDF5 file's folder")
    exit_handlers_unsafe("an HDF5 write failed")   # HDF5's exit handler would retry it and crash
    try:
        fd = f.id.get_vfd_handle()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    except (OSError, RuntimeError, ValueError, TypeError):
        pass   # not a sec2 file, or already closed: the close below does what it can
    for _ in range(2):
        try:
            f.close()
            return
        except Exception:   # noqa: BLE001 - HDF5 reports close failures as RuntimeError
            pass


@contextlib.contextmanager
def quiet_dealloc():
    """Within: h5py's failed releases of temporary objects are not printed.

    After a write fails (a full disk), every h5py object freed on the way out tries to
    release its HDF5 id, fails the same way, and h5py prints each failure as a raw
    traceback ("Exception ignored in: h5py._objects.ObjectID.__dealloc__"). The write's own
    error is raised and reported in words; these add nothing.
    """
    previous, previous_except = sys.unraisablehook, sys.excepthook

    def hook(unraisable):
        if not (isinstance(unraisable.exc_value, RuntimeError) and "h5py" in str(unraisable.object)):
            previous(unraisable)

    def except_hook(kind, value, tb):   # Cython prints the traceback through here first
        frames = []
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_filename)
            tb = tb.tb_next
        if not (kind is RuntimeError and frames and all("h5py" in f for f in frames)):
            previous_except(kind, value, tb)

    sys.unraisablehook, sys.excepthook = hook, except_hook
    try:
        yield
    finally:
        sys.unraisablehook, sys.excepthook = previous, previous_except


def quiet(method):
    """Decorator: run ``method`` inside :func:`quiet_dealloc`."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with quiet_dealloc():
            return method(*args, **kwargs)
    return wrapper
