"""hpcfl.native.cc: C kernels compiled once per machine into the cache folder, loaded through ctypes."""

import hashlib
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hpcfl.models import pool, pool_kernels
from hpcfl.native import cc

needs_cc = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder, and no switches from the environment."""
    monkeypatch.setenv("HPCFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HPCFL_NO_CC", raising=False)
    monkeypatch.delenv("HPCFL_CC", raising=False)
    return tmp_path / "cache" / "kernels"


def source(tmp_path: Path, value: int, name: str = "answer") -> Path:
    path = tmp_path / f"{name}.c"
    path.write_text(f"int answer(void) {{ return {value}; }}\n")
    return path


def compiles(monkeypatch) -> list:
    """Spy on the compiler runs."""
    runs = []
    real = cc._compile
    monkeypatch.setattr(cc, "_compile", lambda *a: (runs.append(a[2]), real(*a)))
    return runs


@needs_cc
def test_compiles_once_into_the_cache_and_loads_from_it(cache, tmp_path, monkeypatch):
    runs = compiles(monkeypatch)
    assert cc.load(source(tmp_path, 41)).answer() == 41
    files = sorted(p.name for p in cache.iterdir())
    assert len(files) == 2 and files[0].startswith("answer-") and files[0].endswith(".so")
    assert files[1] == files[0] + ".sha256"                      # the library's hash beside it
    assert cc.load(source(tmp_path, 41)).answer() == 41          # loaded, not compiled again
    assert len(runs) == 1


@needs_cc
def test_a_changed_source_or_compiler_never_loads_the_stale_file(cache, tmp_path, monkeypatch):
    assert cc.load(source(tmp_path, 1)).answer() == 1
    assert cc.load(source(tmp_path, 2)).answer() == 2             # same name, new source: a new file
    assert len(list(cache.glob("*.so"))) == 2
    text = source(tmp_path, 2).read_bytes()
    assert cc.key(text, cc.compiler()) != cc.key(text, [cc.compiler()[0], "-DOTHER"])


@needs_cc
def test_a_damaged_file_is_compiled_again(cache, tmp_path):
    src = source(tmp_path, 7)
    target = cache / f"answer-{cc.key(src.read_bytes(), cc.compiler())}.so"
    cache.mkdir(parents=True)
    target.write_bytes(b"not a shared library")    # as a full disk might have left it
    with pytest.warns(UserWarning, match="has no recorded hash"):
        assert cc.load(src).answer() == 7
    assert target.read_bytes()[:4] == b"\x7fELF"


@needs_cc
def test_an_unwritable_cache_still_gives_the_kernels_with_a_warning(cache, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HPCFL_CACHE_DIR", str(blocker / "cache"))   # under a file: cannot be made (even as root)
    with pytest.warns(UserWarning, match="cannot write the kernel cache"):
        lib = cc.load(source(tmp_path, 5))
    assert lib.answer() == 5


def test_no_compiler_or_switched_off_gives_none(cache, tmp_path, monkeypatch):
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))            # no cc, gcc or clang anywhere
    assert cc.compiler() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")    # no compiler is not worth a warning: the fallbacks are the same bits
        assert cc.load(source(tmp_path, 3)) is None
    monkeypatch.setenv("HPCFL_CC", "no-such-cc -O1")               # but a compiler asked for by name is
    with pytest.warns(UserWarning, match="HPCFL_CC='no-such-cc -O1' is not a command"):
        assert cc.load(source(tmp_path, 3)) is None
    monkeypatch.delenv("HPCFL_CC")
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv("HPCFL_NO_CC", "1")                          # compilers there, switched off
    assert cc.load(source(tmp_path, 3)) is None
    assert not cache.exists()


@needs_cc
def test_the_compiler_can_be_named(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("HPCFL_CC", f"{cc.compiler()[0]} -DANSWER_OFFSET=1")
    src = tmp_path / "named.c"
    src.write_text("int answer(void) { return 40 + ANSWER_OFFSET; }\n")   # compiles only with the flag
    assert cc.load(src).answer() == 41


LOAD_CHILD = "from pathlib import Path; from hpcfl.native import cc; print(cc.load(Path({src!r})).answer())"


@needs_cc
@pytest.mark.parametrize("damage", ["truncated", "flipped", "planted"])
def test_a_damaged_or_planted_library_is_never_mapped(cache, tmp_path, damage):
    """A truncated library loaded and died with SIGBUS in every later run (and in hpcfl info), flipped
    bytes gave SIGILL, a planted one ran its constructor. Loaded in a child process, so that a
    regression fails the test instead of killing the test process."""
    src = source(tmp_path, 5)
    assert cc.load(src).answer() == 5
    target = next(cache.glob("*.so"))
    data = bytearray(target.read_bytes())
    marker = tmp_path / "constructor-ran"
    # The damage goes to a new file renamed over the library, never into it: this process has the
    # library mapped (cc.load above), and rewriting a mapped file in place made this pytest process
    # die with SIGBUS (rc 135) at exit.
    damaged = tmp_path / "damaged.so"
    if damage == "truncated":          # as a disk that filled up during a compile leaves it
        damaged.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flipped":
        for i in range(len(data) // 3, len(data) // 3 + 256):
            data[i] ^= 0xFF
        damaged.write_bytes(bytes(data))
    else:                              # someone else's library under the cached name
        evil = tmp_path / "evil.c"
        evil.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void run(void) {{ '
                        f'FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\nint answer(void) {{ return 666; }}\n')
        subprocess.run([*cc.compiler(), *cc.FLAGS, str(evil), "-o", str(damaged)], check=True)
    os.replace(damaged, target)
    p = subprocess.run([sys.executable, "-c", LOAD_CHILD.format(src=str(src))], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "5", (p.returncode, p.stderr)
    assert "does not match its recorded hash" in p.stderr and "compiling it again" in p.stderr
    assert not marker.exists()
    assert cc.verified(target) is True                               # compiled again, whole


@needs_cc
def test_a_failed_compile_warns_and_gives_none(cache, tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("int answer(void) { return }\n")
    with pytest.warns(UserWarning, match="could not compile bad.c"):
        assert cc.load(bad) is None
    assert not any(cache.iterdir())                                  # no file, no temporary left


@needs_cc
def test_processes_compiling_at_once_leave_one_whole_file(cache, tmp_path):
    src = source(tmp_path, 9)
    code = f"from pathlib import Path; from hpcfl.native import cc; print(cc.load(Path({str(src)!r})).answer())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["9"] * 4
    names = sorted(p.name for p in cache.iterdir())
    assert len(names) == 2 and names[1] == names[0] + ".sha256"     # no temporaries either
    assert cc.verified(cache / names[0]) is True                     # and the hash is the file's


def test_pooling_kernels_that_give_other_bits_are_not_used(monkeypatch):
    """kernels() checks each form against torch first: one that flips a zero's sign is skipped."""
    good = pool_kernels._numba_kernels() or pool_kernels._c_kernels()
    if good is None:
        pytest.skip("no compiled pooling here")
    broken = SimpleNamespace(backend="c", pool2x2=good.pool2x2, relu_pool2x2=good.relu_pool2x2,
                             relu_pool2x2_grad=lambda g, out, pos, dx: (good.relu_pool2x2_grad(g, out, pos, dx),
                                                                        dx.neg_()))
    assert pool_kernels._agrees_with_torch(good) and not pool_kernels._agrees_with_torch(broken)
    monkeypatch.setattr(pool_kernels, "_KERNELS", [])
    monkeypatch.setattr(pool_kernels, "_c_kernels", lambda: broken)
    monkeypatch.setattr(pool_kernels, "_numba_kernels", lambda: good)
    with pytest.warns(UserWarning, match="C max pooling does not give torch's bits"):
        assert pool.kernels() is good
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(pool.ReLUMaxPool2x2()(x), torch.nn.functional.max_pool2d(torch.relu(x), 2))


def _evil_library(tmp_path: Path, target: Path, marker: Path) -> None:
    """Someone else's library under the cached name, with its matching hash beside it (both planted)."""
    evil = tmp_path / "evil.c"
    evil.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void run(void) {{ '
                    f'FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\nint answer(void) {{ return 666; }}\n')
    subprocess.run([*cc.compiler(), *cc.FLAGS, str(evil), "-o", str(target)], check=True)
    cc._digest_path(target).write_text(hashlib.sha256(target.read_bytes()).hexdigest() + "\n")


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
NOBODY = 65534


@needs_cc
@pytest.mark.parametrize("how", [
    pytest.param("other user owns the root", marks=as_root), pytest.param("other user owns kernels/", marks=as_root),
    "root group-writable", "kernels/ writable by others", "library group-writable", "control: trusted"])
def test_a_library_planted_with_its_hash_where_others_can_write_is_never_mapped(cache, tmp_path, how):
    """A library planted with its hash by another user ran its constructor in the victim's run
    (issue 37.1): the hash beside it only catches damage. Loaded in a child process, which must
    warn naming the folder, compile privately, and leave the planted files alone."""
    src = source(tmp_path, 5)
    root = cache.parent
    cache.mkdir(parents=True)
    os.chmod(root, 0o755)
    os.chmod(cache, 0o755)
    target = cache / f"answer-{cc.key(src.read_bytes(), cc.compiler())}.so"
    marker = tmp_path / "constructor-ran"
    _evil_library(tmp_path, target, marker)
    os.chmod(target, 0o755)
    if how == "other user owns the root":
        os.chown(root, NOBODY, NOBODY)
    elif how == "other user owns kernels/":
        for p in (cache, target, cc._digest_path(target)):
            os.chown(p, NOBODY, NOBODY)
    elif how == "root group-writable":
        os.chmod(root, 0o775)
    elif how == "kernels/ writable by others":
        os.chmod(cache, 0o757)
    elif how == "library group-writable":
        os.chmod(target, 0o775)
    planted = target.read_bytes()
    p = subprocess.run([sys.executable, "-c", LOAD_CHILD.format(src=str(src))], capture_output=True, text=True,
                       timeout=120, check=False)
    if how.startswith("control"):   # the plant is a valid one: where only its owner can write, it is loaded
        assert p.stdout.strip() == "666" and marker.exists()
        return
    assert p.returncode == 0 and p.stdout.strip() == "5", (p.returncode, p.stderr)
    assert not marker.exists()
    if how == "library group-writable":   # the folder is trusted: the library is compiled again in it
        assert "compiling it again" in p.stderr and cc.verified(target) is True
        assert f"could have been replaced by someone else ({target} is writable by group (mode 775))" in p.stderr
        return
    assert "the kernel cache is not used" in p.stderr
    bad = root if "root" in how else cache
    assert f"{bad} is {'owned by another user' if 'other user' in how else 'writable by'}" in p.stderr
    assert target.read_bytes() == planted                  # neither mapped nor overwritten


def test_cache_folders_are_created_private(tmp_path, monkeypatch):
    """The cache root, its missing parents and kernels/ are created 0700, whatever the umask."""
    from hpcfl.native import cachedir
    old = os.umask(0o002)
    try:
        folder = cachedir.private_folder(tmp_path / "a" / "b" / "hpcfl", "kernels")
    finally:
        os.umask(old)
    for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "hpcfl", folder):
        assert p.stat().st_mode & 0o777 == 0o700, p


@needs_cc
def test_an_untrusted_cache_is_warned_about_once_per_process(cache, tmp_path):
    """Every kernel (pooling, group kernels) is loaded through the same folder: one warning, not one
    per library or per call. Caught with every warning recorded, as pytest and ``-W always`` show them."""
    import warnings

    cache.mkdir(parents=True)
    os.chmod(cache.parent, 0o775)                          # the root group-writable: not trusted
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert cc.load(source(tmp_path, 5)).answer() == 5      # compiled privately
        assert cc.load(source(tmp_path, 6, "other")).answer() == 6
        assert cc.load(source(tmp_path, 5)).answer() == 5
    said = [str(w.message) for w in seen if "the kernel cache is not used" in str(w.message)]
    assert len(said) == 1 and f"{cache.parent} is writable by group" in said[0], said
