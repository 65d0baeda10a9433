"""A run from a read-only install writes nothing inside the package, and its compiled kernels are
reused by the next run (issue 36.3), in both forms of the group kernel, which give the same results.

numba kept the fused group kernel (hpcfl/client/fused.py) in the package's own __pycache__,
and its cache never matched (the kernel was a closure: numba keyed it on a pickle of dispatchers
that carry a fresh id in every process), so every run compiled it again and added two files
there. Where a C compiler is found the kernel is now C (hpcfl/client/fused.c), compiled into the
user's cache folder, and numba is not imported at all. Root ignores permission bits, so as root
the copy below is writable in fact: a write inside it is seen in the listing instead of being
refused, which is what the test needs.
"""

import compileall
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

import hpcfl
from hpcfl.native import cc

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "papers" / "fednova_synthetic.toml"   # logreg: vectorize = "auto" uses the group kernel


def listing(root: Path) -> dict:
    """Every file and folder under ``root`` with its size and modification time."""
    out = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


def _run(pkg: Path, cache: Path, out: Path, **env) -> subprocess.CompletedProcess:
    """The job for 3 rounds from the package in ``pkg``, with ``-X importtime`` (stderr lists every import)."""
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("NUMBA_CACHE_DIR", "HPCFL_NO_NUMBA", "HPCFL_NO_CC", "HPCFL_CC", "PYTHONPATH")},
           "PYTHONPATH": str(pkg), "HPCFL_CACHE_DIR": str(cache), **env}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpcfl", "run", str(JOB), "--out", str(out),
                           "--set", "run.rounds=3", "--set", "runtime.progress=none"], cwd=out.parent, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def imports_numba(done: subprocess.CompletedProcess) -> bool:
    return re.search(r"^import time:.*\|\s*numba(\.|$)", done.stderr, re.MULTILINE) is not None


def arrays(out: Path) -> dict:
    """Every dataset of the run's results.h5 but the wall-clock ones (time_*, segments/started)."""
    got = {}
    with h5py.File(out / "results.h5", "r") as f:
        f.visititems(lambda name, obj: got.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return {k: v for k, v in got.items() if not k.split("/")[-1].startswith("time_") and k != "segments/started"}


def test_a_run_from_a_read_only_copy_writes_nothing_inside_it_and_reuses_its_kernels(tmp_path):
    pkg = tmp_path / "site"
    shutil.copytree(Path(hpcfl.__file__).parent, pkg / "hpcfl", ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(pkg, quiet=1)   # as pip installs it: bytecode included
    for path in [pkg, *pkg.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    cache = tmp_path / "cache"
    before = listing(pkg)
    have_cc = cc.compiler() is not None
    try:
        if have_cc:   # the C form: compiled into kernels/ by the first run, mapped by the next; numba never imported
            first = _run(pkg, cache, tmp_path / "c1")
            assert listing(pkg) == before                           # nothing written inside the package
            built = listing(cache / "kernels")
            assert [n for n in built if n.startswith("fused-") and n.endswith(".so")], built
            assert not imports_numba(first) and not (cache / "numba").exists()
            assert not imports_numba(_run(pkg, cache, tmp_path / "c2"))
            assert listing(cache / "kernels") == built              # loaded, not compiled again
        # numba's form (no C): compiled into numba/ by the first run, matched by the next
        second = _run(pkg, cache, tmp_path / "numba1", HPCFL_NO_CC="1")
        assert imports_numba(second)
        assert listing(pkg) == before
        kernels = listing(cache / "numba")
        assert any("logreg_group" in name and name.endswith(".nbi") for name in kernels), kernels
        _run(pkg, cache, tmp_path / "numba2", HPCFL_NO_CC="1")
        assert listing(pkg) == before
        assert listing(cache / "numba") == kernels                  # the kernel matched: nothing compiled or added
        if have_cc:   # the two forms give the same run, bit for bit
            c_run, numba_run = arrays(tmp_path / "c1"), arrays(tmp_path / "numba1")
            assert c_run.keys() == numba_run.keys() and {"final/params", "clients/train_loss"} <= c_run.keys()
            for name, value in c_run.items():
                assert np.array_equal(value, numba_run[name], equal_nan=value.dtype.kind == "f"), name
    finally:
        for path in [pkg, *pkg.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)       # so that tmp_path can be removed
