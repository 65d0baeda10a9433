"""C kernels compiled once per machine and loaded through ctypes: start-up in milliseconds.

Loading numba-compiled loops from numba's cache costs 0.5-1 s per process (numba, llvmlite
and, through numba's BLAS check, scipy are imported, and LLVM is set up); on workload W that
was the whole gap between the engine's start-up and a bare torch loop's. Kernels that every
CPU run of a common model needs (:mod:`hpcfl.models.pool`, and the group kernels of
:mod:`hpcfl.client.fused`) therefore also ship as C source.
The first process that needs one compiles it with the machine's C compiler into the cache
folder; every later process maps the shared library in about a millisecond.

- Compiler: ``$HPCFL_CC`` (a command, e.g. ``"gcc-12"``), else the first of ``cc``, ``gcc`` and
  ``clang`` on the PATH. ``$CC`` is not read: on clusters it often names an MPI wrapper or a
  compiler whose default floating-point model is not IEEE. Flags: ``-O2 -std=c99 -shared
  -fPIC`` (no ``-march=native``, so one file serves every node of an architecture), then a
  source's own (:func:`load`'s ``flags``: the group kernels add ``-O3 -ffp-contract=off -lm``).
- Cache: ``kernels/NAME-KEY.so`` under ``$HPCFL_CACHE_DIR``, else ``$XDG_CACHE_HOME/hpcfl``, else
  ``~/.cache/hpcfl``; KEY hashes the source, the compiler's path, size and time stamp, the
  flags and the platform, so a changed source or compiler never loads a stale file. A file is
  compiled under a temporary name, fsynced and renamed into place: ranks compiling at once leave
  one whole file. A folder that cannot be written costs a compile per process (a warning says so).
- Content check: beside each ``.so`` its SHA-256 is kept in ``NAME-KEY.so.sha256``, written after
  the compile; the library is hashed and compared before it is mapped. A file that does not
  match (truncated by a full disk: SIGBUS in every later run; flipped bits: SIGILL) is never
  loaded: it is compiled again, and a warning says so. The hash guards against damage only:
  whoever can write the folder can write a library and its hash. So the folder is used only
  when nobody else can write it (:func:`hpcfl.native.cachedir.private_folder`: the cache root and
  ``kernels/`` owned by this user and not writable by group or others, created 0700; the library
  and its hash file likewise); otherwise a warning names the folder and the fix, and the kernel
  is compiled into a private temporary folder for this process.
- No compiler, a failed compile, or ``HPCFL_NO_CC=1``: :func:`load` returns None and the
  caller uses its numba or torch form (the same bits; kernels check their own results).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from . import cachedir
from .cachedir import cache_root

FLAGS = ("-O2", "-std=c99", "-shared", "-fPIC")
COMPILE_TIMEOUT_S = 120


def compiler() -> list[str] | None:
    """The compiler command (argv prefix), or None where there is none."""
    if os.environ.get("HPCFL_CC"):
        argv = shlex.split(os.environ["HPCFL_CC"])
        found = shutil.which(argv[0]) if argv else None
        return [found, *argv[1:]] if found else None
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def key(source: bytes, cc: list[str], flags: tuple[str, ...] = ()) -> str:
    """16 hex digits identifying the compiled file: source, compiler (path, size, mtime), flags, platform."""
    st = os.stat(os.path.realpath(cc[0]))
    text = "\0".join([*cc, str(st.st_size), str(st.st_mtime_ns), *FLAGS, *flags, sys.platform, platform.machine()])
    return hashlib.sha256(source + b"\0" + text.encode()).hexdigest()[:16]


def cache_folder() -> Path:
    """``kernels/`` in hpcfl's cache folder (the one the dataset cache's ``"auto"`` uses)."""
    return cache_root("auto") / "kernels"


def _compile(cc: list[str], source: Path, target: Path, flags: tuple[str, ...] = ()) -> None:
    """Compile ``source`` into ``target`` (a temporary name beside it, fsynced, then renamed into
    place), and write its hash beside it (:func:`_digest_path`). ``flags`` follow the source
    (options and libraries, e.g. ``-lm``)."""
    tag = f"{os.getpid()}.{os.urandom(4).hex()}.tmp"
    tmp = target.with_name(f".{target.name}.{tag}")
    side = _digest_path(target)
    side_tmp = side.with_name(f".{side.name}.{tag}")
    try:
        done = subprocess.run([*cc, *FLAGS, str(source), "-o", str(tmp), *flags], capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(cc)} failed: {(done.stderr or done.stdout).strip()[:500]}")
        with open(tmp, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
            os.fsync(f.fileno())   # the bytes are on disk before a name points at them
        os.chmod(tmp, 0o755)      # whatever the umask: a group-writable library would be refused
        os.replace(tmp, target)   # a reader sees no file or a whole one
        side_tmp.write_text(digest + "\n")
        os.chmod(side_tmp, 0o644)
        os.replace(side_tmp, side)
    finally:
        tmp.unlink(missing_ok=True)
        side_tmp.unlink(missing_ok=True)


def _digest_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def verified(target: Path) -> bool | None:
    """Whether the cached library ``target`` matches the hash written beside it; None if there is none.

    A missing or unreadable hash file counts as a mismatch, and so does a library or hash file
    that someone else could have written (:func:`hpcfl.native.cachedir.check`): the library is
    compiled again.
    """
    if not target.exists():
        return None
    try:
        side = _digest_path(target)
        cachedir.check(target)
        cachedir.check(side)
        expected = side.read_text().strip()
        with open(target, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() == expected
    except OSError:
        return False


def _not_verified(target: Path) -> str:
    """Why :func:`verified` said False of ``target``, for the warning."""
    side = _digest_path(target)
    for path in (target, side):
        try:
            why = cachedir.untrusted_because(os.stat(path))
        except OSError:
            continue
        if why:
            return f"could have been replaced by someone else ({path} is {why})"
    if side.exists():
        return "does not match its recorded hash (damaged, e.g. by a full disk, or replaced)"
    return "has no recorded hash (an older hpcfl's, or damaged)"


def load(source: Path, flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The shared library built from the C file ``source`` (with :data:`FLAGS` and then ``flags``),
    compiled on first use; None where no C compiler can be had, compiling fails, or ``HPCFL_NO_CC``
    is set (a warning says why when a compiler was there or ``HPCFL_CC`` named one that is not)."""
    if os.environ.get("HPCFL_NO_CC"):
        return None
    cc = compiler()
    if cc is None:
        if os.environ.get("HPCFL_CC"):   # asked for by name: say why it is not used
            warnings.warn(f"hpcfl: HPCFL_CC={os.environ['HPCFL_CC']!r} is not a command found on the PATH; the C "
                          f"kernels are off. Set it to an installed C compiler, or unset it to use cc, gcc or clang",
                          stacklevel=2)
        return None
    text = source.read_bytes()
    folder = cache_folder()
    target = folder / f"{source.stem}-{key(text, cc, flags)}.so"
    try:
        cachedir.private_folder(folder.parent, folder.name)   # before anything in it is read
        ok = verified(target)
        if ok:
            try:
                return ctypes.CDLL(str(target))
            except OSError:   # an unloadable file with a matching hash (copied from another machine?)
                pass
        elif ok is False:   # never mapped: a damaged library can crash the process (SIGBUS, SIGILL)
            warnings.warn(f"hpcfl: the compiled kernel {target} {_not_verified(target)}; compiling it again",
                          stacklevel=2)
        _compile(cc, source, target, flags)
        return ctypes.CDLL(str(target))
    except cachedir.UntrustedFolder as err:   # never read from, never written to: compile privately
        if cachedir.first_time(err):
            warnings.warn(f"hpcfl: the kernel cache is not used: {err}. The C kernels are compiled anew, "
                          f"in a private folder, in every process until then", stacklevel=2)
    except OSError as err:   # the cache folder cannot be written: compile into a private one
        warnings.warn(f"hpcfl: cannot write the kernel cache {folder} ({err}); the C kernels are compiled "
                      f"anew in every process. Set HPCFL_CACHE_DIR to a writable folder", stacklevel=2)
    except (RuntimeError, subprocess.SubprocessError) as err:
        warnings.warn(f"hpcfl: could not compile {source.name} ({err}); its numba or torch form is used",
                      stacklevel=2)
        return None
    with tempfile.TemporaryDirectory(prefix="hpcfl-cc-") as tmp:
        try:
            private = Path(tmp) / target.name
            _compile(cc, source, private, flags)
            return ctypes.CDLL(str(private))   # mapped: the file may go when the folder does
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            warnings.warn(f"hpcfl: could not compile {source.name} ({err}); its numba or torch form is used",
                          stacklevel=2)
            return None
