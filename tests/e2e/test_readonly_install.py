"""A run from a read-only install writes nothing inside the package, and its compiled kernels are
reused by the next run (issue 36.3).

numba kept the fused group kernel (hpcfl/client/fused.py) in the package's own __pycache__,
and its cache never matched (the kernel was a closure: numba keyed it on a pickle of dispatchers
that carry a fresh id in every process), so every run compiled it again and added two files
there. Root ignores permission bits, so as root the copy below is writable in fact: a write
inside it is seen in the listing instead of being refused, which is what the test needs.
"""

import compileall
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import hpcfl

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "papers" / "fednova_synthetic.toml"   # logreg: vectorize = "auto" uses the numba kernel


def listing(root: Path) -> dict:
    """Every file and folder under ``root`` with its size and modification time."""
    out = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


def _run(pkg: Path, cache: Path, out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "HPCFL_NO_NUMBA", "PYTHONPATH")}
    env.update(PYTHONPATH=str(pkg), HPCFL_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "hpcfl", "run", str(JOB), "--out", str(out), "--set", "run.rounds=1",
                           "--set", "runtime.progress=none"], cwd=out.parent, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_a_run_from_a_read_only_copy_writes_nothing_inside_it_and_reuses_its_kernels(tmp_path):
    pkg = tmp_path / "site"
    shutil.copytree(Path(hpcfl.__file__).parent, pkg / "hpcfl", ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(pkg, quiet=1)   # as pip installs it: bytecode included
    for path in [pkg, *pkg.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    cache = tmp_path / "cache"
    before = listing(pkg)
    try:
        first = _run(pkg, cache, tmp_path / "run1")
        assert first.returncode == 0, first.stderr[-3000:]
        assert listing(pkg) == before                               # nothing written inside the package
        kernels = listing(cache / "numba")
        assert any("logreg_group" in name and name.endswith(".nbi") for name in kernels), kernels
        second = _run(pkg, cache, tmp_path / "run2")
        assert second.returncode == 0, second.stderr[-3000:]
        assert listing(pkg) == before
        assert listing(cache / "numba") == kernels                  # the kernel matched: nothing compiled or added
    finally:
        for path in [pkg, *pkg.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)       # so that tmp_path can be removed
