"""``hpcfl data list | get`` against a local HTTP server serving files in the real formats.

The server (http.server in a thread) serves a tiny ``cifar-10-python.tar.gz`` with the real
layout and MNIST's four gzipped IDX files; it honours ``Range`` and can break a response off
after N bytes. The registry's checksums are replaced by the tiny files' own (the real ones
would refuse them, as the corrupt-file test shows). ~2 s.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import io
import os
import re
import tarfile
import threading
import tomllib
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_data_files import write_cifar10, write_mnist

from hpcfl import cli, config, data
from hpcfl.data import fetch, sources
from hpcfl.errors import ConfigError, DataError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Mirror:
    """Files by name over HTTP; ``cut[name] = n`` sends the full length but only n bytes, once.

    ``hostile[name]`` serves it as a hostile or broken server would (:meth:`serve_hostile`): ``"longer"``
    (100 bytes more than the file, announced), ``"endless"`` (the file, then bytes without end and
    without a length), ``"stall"`` (half the file, then nothing), ``("drip", n, seconds)`` (n bytes
    every so many seconds), ``"ignores range"`` (200 and the whole file, also to a Range request).
    """

    def __init__(self, files: dict[str, bytes]):
        self.files, self.cut, self.log, self.hostile = dict(files), {}, [], {}
        self.done = threading.Event()   # set on exit: a stalled or dripping answer ends
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                rng = self.headers.get("Range")
                mirror.log.append((name, rng))
                if name not in mirror.files:
                    self.send_error(404)
                    return
                blob = mirror.files[name]
                if name in mirror.hostile:
                    mirror.serve_hostile(self, blob, mirror.hostile[name])
                    return
                start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1)) if rng else 0
                if start >= len(blob) and rng:
                    self.send_error(416)
                    return
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(blob) - 1}/{len(blob)}")
                self.send_header("Content-Length", str(len(blob) - start))
                self.end_headers()
                n = mirror.cut.pop(name, None)
                self.wfile.write(blob[start:] if n is None else blob[start:start + n])
                if n is not None:
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mirror"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def serve_hostile(self, handler, blob: bytes, how) -> None:
        handler.send_response(200)
        if how == "longer":
            handler.send_header("Content-Length", str(len(blob) + 100))
        elif how != "endless":
            handler.send_header("Content-Length", str(len(blob)))
        handler.end_headers()
        handler.close_connection = True
        try:
            if how == "longer":
                handler.wfile.write(blob + b"x" * 100)
            elif how == "endless":   # 16 MB of it, so that a client that reads on still ends
                handler.wfile.write(blob)
                for _ in range(256):
                    handler.wfile.write(b"\0" * 65536)
            elif how == "ignores range":   # 200 and the whole file, whatever Range asked for
                handler.wfile.write(blob)
            elif how == "stall":
                handler.wfile.write(blob[:len(blob) // 2])
                handler.wfile.flush()
                self.done.wait(60)
            else:
                _, n, every = how
                for i in range(0, len(blob), n):
                    handler.wfile.write(blob[i:i + n])
                    handler.wfile.flush()
                    if self.done.wait(every):
                        return
        except OSError:   # the client hung up: what a client that stops in time does
            pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.server.shutdown()
        self.server.server_close()


def targz(folder: str, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(folder, arcname=arcname)
    return buf.getvalue()


def tiny_cifar10(tmp_path) -> bytes:
    write_cifar10(str(tmp_path / "made"), n_per_batch=6, n_test=5)   # the real py2 pickles
    return targz(str(tmp_path / "made" / "cifar-10-batches-py"), "cifar-10-batches-py")


def as_published(monkeypatch, name: str, blobs: dict[str, bytes]):
    """Make the registry's entry for ``name`` describe ``blobs`` (size, md5), as the source's does."""
    src = sources.SOURCES[name]
    files = tuple(dataclasses.replace(r, size=len(blobs[r.name]), md5=hashlib.md5(blobs[r.name]).hexdigest(),
                                      sha256=None) for r in src.files)
    monkeypatch.setitem(sources.SOURCES, name, dataclasses.replace(src, files=files))


def get(name, root, mirror, capsys):
    rc = cli.main(["data", "get", name, "--root", str(root), "--mirror", mirror])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_get_cifar10_then_a_job_reads_it(tmp_path, monkeypatch, capsys):
    blob = tiny_cifar10(tmp_path)
    as_published(monkeypatch, "cifar10", {"cifar-10-python.tar.gz": blob})
    root = tmp_path / "data"
    with Mirror({"cifar-10-python.tar.gz": blob}) as m:
        rc, out, err = get("cifar10", root, m.url, capsys)
    assert rc == 0, err
    assert m.log == [("cifar-10-python.tar.gz", None)]
    assert f'root = "{root}"' in out and "--set data.root=" in out
    assert sorted(os.listdir(root)) == ["cifar-10-batches-py"]          # no archive, scratch or .part left
    assert sorted(os.listdir(root / "cifar-10-batches-py")) == sorted(
        ["batches.meta", "test_batch"] + [f"data_batch_{i}" for i in range(1, 6)])
    ds = data.load_dataset("cifar10", None, str(root), 0)
    assert ds.x_train.shape == (30, 3, 32, 32) and ds.x_test.shape == (5, 3, 32, 32)
    # a job with that data.root: hpcfl partition loads it (one pass of checks finds nothing)
    png = tmp_path / "p.png"
    argv = ["partition", os.path.join(ROOT, "jobs", "quickstart.toml"), "--set", "data.dataset=cifar10",
            "--set", f"data.root={root}", "--set", "data.partition=iid", "--set", "data.num_clients=3", "--set", "algorithm.clients_per_round=0",
            "--png", str(png)]
    assert cli.main(argv) == 0
    assert png.exists()
    # a second get leaves the folder as it is and asks nothing of the server
    with Mirror({}) as m:
        rc, out, _ = get("cifar10", root, m.url, capsys)
    assert rc == 0 and "already exists" in out and m.log == []


def mnist_files(tmp_path) -> dict[str, bytes]:
    made = tmp_path / "idx"
    made.mkdir()
    write_mnist(str(made), gz=True, n=50, m=10)
    return {p.name: p.read_bytes() for p in made.iterdir()}


def test_interrupted_download_resumes_with_range(tmp_path, monkeypatch, capsys):
    blobs = mnist_files(tmp_path)
    as_published(monkeypatch, "mnist", blobs)
    root = tmp_path / "data"
    big = "train-images-idx3-ubyte.gz"
    with Mirror(blobs) as m:
        m.cut[big] = 1000
        rc, _, err = get("mnist", root, m.url, capsys)
        assert rc == 2 and "broke off after 1,000 bytes" in err and "run the same command again" in err
        part = root / fetch.SCRATCH / (big + ".part")
        assert part.read_bytes() == blobs[big][:1000]
        assert not (root / "mnist" / big).exists()               # nothing half-written where a run reads
        rc, out, err = get("mnist", root, m.url, capsys)
    assert rc == 0, err
    assert (big, "bytes=1000-") in m.log and "resuming after 1,000 bytes" in out
    assert m.log.count((big, None)) == 1                         # the rest was never fetched twice
    for name, blob in blobs.items():
        assert (root / "mnist" / name).read_bytes() == blob
    assert not (root / fetch.SCRATCH).exists()
    ds = data.load_dataset("mnist", None, str(root), 0)
    assert ds.x_train.shape == (50, 1, 28, 28) and ds.x_test.shape == (10, 1, 28, 28)


def test_corrupt_file_is_refused_and_moved_aside(tmp_path, monkeypatch, capsys):
    blob = tiny_cifar10(tmp_path)
    root = tmp_path / "data"
    # the registry as shipped: the real archive's md5 and size; the mirror serves another file
    with Mirror({"cifar-10-python.tar.gz": blob}) as m:
        rc, _, err = get("cifar10", root, m.url, capsys)
    assert rc == 2
    assert f"{len(blob):,} bytes where the source's file has 170,498,071" in err
    rejected = root / fetch.SCRATCH / "cifar-10-python.tar.gz.rejected"
    assert str(rejected) in err and rejected.read_bytes() == blob
    assert sorted(os.listdir(root)) == [fetch.SCRATCH]
    assert os.listdir(root / fetch.SCRATCH) == [rejected.name]
    # right size, wrong content: the md5 refuses it
    src = sources.SOURCES["cifar10"]
    monkeypatch.setitem(sources.SOURCES, "cifar10", dataclasses.replace(
        src, files=(dataclasses.replace(src.files[0], size=len(blob)),)))
    with Mirror({"cifar-10-python.tar.gz": blob}) as m:
        rc, _, err = get("cifar10", root, m.url, capsys)
    assert rc == 2
    assert f"md5 {hashlib.md5(blob).hexdigest()} where the source's file has c58f30108f718f92721af3b95e74349a" in err
    assert not (root / "cifar-10-batches-py").exists()
    # and a run on that root is told how to get the data
    with pytest.raises(ConfigError, match=r"hpcfl data get cifar10 --root DIR"):
        config.load(os.path.join(ROOT, "jobs", "quickstart.toml"),
                    ["data.dataset=cifar10", f"data.root={root}"], files=True)


def _tar(members) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for info, payload in members:
            tf.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink", "hardlink"])
def test_unsafe_archives_are_refused_whole(tmp_path, kind):
    ok = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
    ok.size = 3
    bad = tarfile.TarInfo({"dotdot": "cifar-10-batches-py/../../evil", "absolute": "/tmp/evil"}.get(
        kind, "cifar-10-batches-py/link"))
    if kind == "symlink":
        bad.type, bad.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "hardlink":
        bad.type, bad.linkname = tarfile.LNKTYPE, "cifar-10-batches-py/data_batch_1"
    else:
        bad.size = 4
    path = tmp_path / "a.tar"
    path.write_bytes(_tar([(ok, b"abc"), (bad, b"evil" if bad.isfile() else None)]))
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(DataError, match="refusing the archive"):
        fetch.unpack(str(path), "tar", str(root), "cifar-10-batches-py")
    assert os.listdir(root) == []                  # not even the good member was placed
    assert not (tmp_path / "evil").exists()


def _zip(members) -> bytes:
    """A zip of ``(name, unix mode or None for writestr's default, payload)``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, mode, payload in members:
            info = zipfile.ZipInfo(name)
            if mode is not None:
                info.external_attr = mode << 16
            zf.writestr(info if mode is not None else name, payload)
    return buf.getvalue()


@pytest.mark.parametrize("mode,refused", [(None, False), (0o100644, False), (0o644, False), (0o120777, True),
                                          (0o020644, True), (0o010644, True), (0o060644, True)],
                         ids=["writestr", "regular", "no type bits", "symlink", "char device", "fifo", "block device"])
def test_zip_members_are_judged_by_their_file_type(tmp_path, mode, refused):
    """A link or device member refuses the archive; a member with no file-type bits (what zipfile.writestr
    and Windows tools write) is a plain file, as unzip and Python's own extractall treat it."""
    path = tmp_path / "a.zip"
    path.write_bytes(_zip([("set/a.txt", 0o100644, b"abc"), ("set/b", mode, b"/etc/passwd")]))
    root = tmp_path / "root"
    root.mkdir()
    if refused:
        with pytest.raises(DataError, match="member 'set/b' is a link or special file; refusing the archive"):
            fetch.unpack(str(path), "zip", str(root), "set")
        assert os.listdir(root) == []
        return
    fetch.unpack(str(path), "zip", str(root), "set")
    assert sorted(os.listdir(root / "set")) == ["a.txt", "b"]
    assert (root / "set" / "b").read_bytes() == b"/etc/passwd" and not (root / "set" / "b").is_symlink()


def test_list_names_every_dataset_with_its_source_or_none(capsys):
    assert cli.main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for name, src in sources.SOURCES.items():
        for r in src.files:
            assert f"{r.url}  {fetch.size_text(r)}" in out
            assert (r.md5 or r.sha256) in out
        assert f"hpcfl data get {name} --root DIR" in out
    for name in set(data.DATASETS) - set(sources.SOURCES) - set(sources.ELSEWHERE) - {"digits"}:
        assert re.search(rf"^{name}: .*; generated, no download$", out, re.M)
    # the natural benchmarks: where their files come from, in words, and no download command
    assert re.search(r"^leaf: .*https://github\.com/TalwalkarLab/leaf.*preprocess\.sh", out, re.M)
    for archive in ("fed_emnist", "shakespeare", "stackoverflow"):
        assert f"    https://storage.googleapis.com/tff-datasets-public/{archive}.tar.bz2: " in out
    assert "https://github.com/apple/pfl-research" in out and "FLAIR" in out
    assert "hpcfl data get leaf" not in out and "hpcfl data get tff" not in out
    assert "170,498,071 bytes (170.5 MB)  md5 c58f30108f718f92721af3b95e74349a" in out


def test_registry_facts_are_well_formed():
    for name, src in sources.SOURCES.items():
        assert name in data.DATASETS and name in sources.STAND_INS
        for r in src.files:
            # https only: over plain http anyone on the path could swap the file (the checksum would
            # refuse it, after the whole download) or stall it
            assert r.url.endswith("/" + r.name) and r.url.startswith("https://"), r.url
            assert r.md5 is None or re.fullmatch(r"[0-9a-f]{32}", r.md5)
            assert r.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", r.sha256)
            assert r.md5 or r.sha256
            assert isinstance(r.size, int) and r.size > 0   # the bound a download stops at
    speech = sources.SOURCES["speech_commands"].files[0]
    assert speech.url == "https://storage.googleapis.com/download.tensorflow.org/data/speech_commands_v0.02.tar.gz"
    assert speech.size == 2428923189 and speech.sha256.startswith("af14739e")   # the published facts, kept
    fashion = sources.SOURCES["fashion_mnist"].files[0]
    assert fashion.url.startswith("https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/")
    assert (fashion.size, fashion.md5) == (26421880, "8d4fb7e6c68d591d4c3dfef9ec88bf0d")


def test_unknown_or_generated_names(tmp_path, capsys):
    assert cli.main(["data", "get", "cifar1O", "--root", str(tmp_path)]) == 2
    assert "did you mean 'cifar10'?" in capsys.readouterr().err
    assert cli.main(["data", "get", "synthetic_images", "--root", str(tmp_path)]) == 2
    assert "needs no download" in capsys.readouterr().err
    assert cli.main(["data", "get", "tff", "--root", str(tmp_path)]) == 2
    assert "'tff' is not downloaded by hpcfl: TensorFlow Federated's HDF5 archives" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_no_network_says_what_to_do(tmp_path, monkeypatch, capsys):
    # a port nobody listens on: the connection is refused at once
    with Mirror({}) as m:
        url = m.url
    rc, _, err = get("cifar10", tmp_path / "d", url, capsys)
    assert rc == 2 and "cannot reach" in err and "HPCFL_DATA_MIRROR" in err


def test_a_file_copied_in_by_hand_needs_no_network(tmp_path, monkeypatch, capsys):
    blob = tiny_cifar10(tmp_path)
    as_published(monkeypatch, "cifar10", {"cifar-10-python.tar.gz": blob})
    root = tmp_path / "d"
    (root / fetch.SCRATCH).mkdir(parents=True)
    (root / fetch.SCRATCH / "cifar-10-python.tar.gz.part").write_bytes(blob)
    hashed = []
    digests = fetch._digests
    monkeypatch.setattr(fetch, "_digests", lambda path, *a: hashed.append(path) or digests(path, *a))
    with Mirror({}) as m:
        url = m.url
    rc, out, err = get("cifar10", root, url, capsys)   # the server is gone: nothing is fetched
    assert rc == 0, err
    assert "is complete" in out
    assert sorted(os.listdir(root)) == ["cifar-10-batches-py"]
    assert len(hashed) == 1   # the complete .part is hashed once, not again before it is placed


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "mnist", "fashion_mnist", "emnist", "speech_commands"])
def test_missing_data_names_the_command(tmp_path, name):
    (tmp_path / "empty").mkdir()
    problems = data.DATASETS[name].files(data.dataset_options(name)(), str(tmp_path / "empty"))
    assert len(problems) == 1 and f"hpcfl data get {name} --root DIR" in problems[0]
    assert "to run without it on a CPU: --set data.dataset=synthetic_images" in problems[0]
    problems = data.DATASETS[name].files(data.dataset_options(name)(), str(tmp_path / "nowhere"))
    assert len(problems) == 1 and f"hpcfl data get {name} --root DIR" in problems[0]


def test_every_paper_job_names_its_download_and_cpu_stand_in():
    jobs = sorted(glob.glob(os.path.join(ROOT, "jobs", "papers", "*.toml")))
    assert len(jobs) >= 20
    for path in jobs:
        with open(path) as f:
            text = f.read()
        name = tomllib.loads(text)["data"]["dataset"]
        if name in sources.SOURCES:
            assert f"hpcfl data get {name} --root" in text, path
            assert "CPU stand-in" in text, path
