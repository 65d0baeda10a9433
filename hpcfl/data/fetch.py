"""``hpcfl data get``: download a dataset from its source, verify it, unpack it safely.

For each file of a :class:`~hpcfl.data.sources.Source`:

1. **Download** into ``<root>/.hpcfl_download/<file>.part`` with :mod:`urllib`. A ``.part``
   left by an interrupted download is resumed with an HTTP ``Range`` request; a server that
   answers the whole file instead (200) starts it over.
2. **Verify** size and checksum (md5 and/or sha256, as the source publishes). A wrong file is
   moved aside to ``<file>.rejected`` (never where a run reads) and :class:`DataError` says so.
3. **Place** it: a plain file is renamed into ``<root>/<folder>/`` (one atomic rename); an
   archive is unpacked into a scratch folder inside ``root`` and the finished folder renamed
   into place, so a run never sees half a dataset. Members that are links, devices, absolute
   paths or climb out with ``..`` refuse the whole archive.

Nothing here imports above the data layer; the command line is :mod:`hpcfl.cli.data_cmd`.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import stat
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable

from ..errors import DataError
from .sources import Remote, Source

MIRROR_ENV = "HPCFL_DATA_MIRROR"
SCRATCH = ".hpcfl_download"
_BLOCK = 1 << 20
_TIMEOUT = 60.0


def url_of(remote: Remote, mirror: str | None) -> str:
    """The URL to fetch: the source's, or ``<mirror>/<file name>``."""
    return remote.url if not mirror else mirror.rstrip("/") + "/" + remote.name


def size_text(remote: Remote) -> str:
    size = remote.size
    scale, unit = (1e9, "GB") if size >= 1e9 else (1e6, "MB") if size >= 1e6 else (1e3, "kB")
    return f"{size:,} bytes ({size / scale:.1f} {unit})"


def checksum_text(remote: Remote) -> str:
    return ", ".join(f"{k} {v}" for k, v in (("sha256", remote.sha256), ("md5", remote.md5)) if v)


def _digests(path: str, upto: int | None = None):
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with open(path, "rb") as f:
        left = upto
        while left is None or left > 0:
            block = f.read(_BLOCK if left is None else min(_BLOCK, left))
            if not block:
                break
            md5.update(block)
            sha.update(block)
            if left is not None:
                left -= len(block)
    return md5, sha


def verify(path: str, remote: Remote) -> str | None:
    """None when ``path`` is the source's file, else what is wrong (size or checksum)."""
    size = os.path.getsize(path)
    if size != remote.size:
        return f"{size:,} bytes where the source's file has {remote.size:,}"
    md5, sha = _digests(path)
    for name, want, got in (("sha256", remote.sha256, sha), ("md5", remote.md5, md5)):
        if want and got.hexdigest() != want.lower():
            return f"{name} {got.hexdigest()} where the source's file has {want}"
    return None


def download(url: str, part: str, say: Callable[[str], None], opener=urllib.request.urlopen) -> None:
    """Fetch ``url`` into ``part``, resuming from what ``part`` already holds.

    Raises DataError on an HTTP error or a connection that breaks off; the ``.part`` is kept
    so that running the same command again resumes it.
    """
    have = os.path.getsize(part) if os.path.exists(part) else 0
    req = urllib.request.Request(url, headers={"User-Agent": "hpcfl-data-get"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = opener(req, timeout=_TIMEOUT)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:   # the .part already holds the whole file
            return
        raise DataError(f"{url}: HTTP {e.code} {e.reason}; check the address (hpcfl data list) or the "
                        f"mirror (${MIRROR_ENV}, --mirror)") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise DataError(f"cannot reach {url} ({reason}); this machine may have no internet: download the "
                        f"file elsewhere and copy it to {part} (then run the same command), or set "
                        f"${MIRROR_ENV} to a mirror") from None
    with resp:
        resumed = have and getattr(resp, "status", 200) == 206
        if have and not resumed:
            say(f"  the server does not resume downloads: starting {os.path.basename(part)} over")
        elif resumed:
            say(f"  resuming after {have:,} bytes")
        got = have if resumed else 0
        length = resp.headers.get("Content-Length")
        total = got + int(length) if length is not None else None
        tenth = got * 10 // total if total else 0
        try:
            with open(part, "ab" if resumed else "wb") as f:
                while True:
                    block = resp.read(_BLOCK)
                    if not block:
                        break
                    f.write(block)
                    got += len(block)
                    if total and got * 10 // total > tenth and got < total:   # a line per tenth: minutes on 2 GB
                        tenth = got * 10 // total
                        say(f"  {10 * tenth}% ({got / 1e6:,.0f} of {total / 1e6:,.0f} MB)")
        except (OSError, http.client.HTTPException) as e:   # a reset, a timeout, IncompleteRead
            raise DataError(f"the download of {url} broke off after {got:,} bytes ({type(e).__name__}); "
                            "run the same command again to resume it") from None
        if total is not None and got < total:
            raise DataError(f"the download of {url} broke off after {got:,} bytes; run the same command again "
                            "to resume it")


# ------------------------------------------------------------------------ unpacking


def _safe_name(name: str, archive: str) -> str:
    norm = os.path.normpath(name.replace("\\", "/"))
    if os.path.isabs(norm) or norm == ".." or norm.startswith("../") or ":" in norm.split("/")[0]:
        raise DataError(f"{archive}: member {name!r} would be written outside the dataset folder; "
                        "refusing the archive (it is not the source's)")
    return norm


def _write_members(members, into: str, path: str) -> None:
    """Write an archive's checked members under ``into``: ``members`` gives (name, is a folder,
    a function opening the member's bytes), for tar and zip alike."""
    for name, is_dir, opener in members:
        target = os.path.join(into, _safe_name(name, path))
        if is_dir:
            os.makedirs(target, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with opener() as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, _BLOCK)


def _unpack_tar(path: str, into: str) -> None:
    try:
        with tarfile.open(path, "r:*") as tf:
            members = tf.getmembers()
            for m in members:
                _safe_name(m.name, path)
                if not (m.isfile() or m.isdir()):
                    kind = "a link" if (m.issym() or m.islnk()) else "a device or pipe"
                    raise DataError(f"{path}: member {m.name!r} is {kind}; refusing the archive (hpcfl unpacks "
                                    "only plain files and folders)")
            _write_members(((m.name, m.isdir(), lambda m=m: tf.extractfile(m)) for m in members), into, path)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{path} is not a readable tar archive ({type(e).__name__}: {e})") from None


def _unpack_zip(path: str, into: str) -> None:
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            for info in infos:
                _safe_name(info.filename, path)
                mode = info.external_attr >> 16
                if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise DataError(f"{path}: member {info.filename!r} is a link or special file; refusing the "
                                    "archive (hpcfl unpacks only plain files and folders)")
            _write_members(((i.filename, i.is_dir(), lambda i=i: zf.open(i)) for i in infos), into, path)
    except (zipfile.BadZipFile, EOFError, OSError) as e:
        raise DataError(f"{path} is not a readable zip archive ({type(e).__name__}: {e})") from None


def unpack(path: str, kind: str, root: str, folder: str) -> None:
    """Unpack archive ``path`` so that its files end up in ``root/folder``, all or nothing.

    Members are checked before anything is written (no link, device, absolute path or
    ``..``); the files go to a scratch folder inside ``root`` that is renamed into place.
    """
    scratch = tempfile.mkdtemp(prefix=".hpcfl_unpack_", dir=root)
    try:
        (_unpack_tar if kind == "tar" else _unpack_zip)(path, scratch)
        top = os.listdir(scratch)
        made = os.path.join(scratch, folder) if top == [folder] else scratch
        if made == scratch:
            os.chmod(scratch, 0o755)   # mkdtemp makes it 0700
        os.rename(made, os.path.join(root, folder))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------------ the command


def get(name: str, source: Source, root: str, mirror: str | None = None,
        say: Callable[[str], None] = print, opener=urllib.request.urlopen) -> str:
    """Download, verify and place dataset ``name`` under ``root``; returns ``root`` (absolute).

    Raises DataError for anything the user must act on (no network, a wrong file, a folder
    in the way); a wrong file is moved to ``<root>/.hpcfl_download/<file>.rejected``.
    """
    root = os.path.abspath(root)
    dest = os.path.join(root, source.folder)
    archives = [r for r in source.files if r.unpack]
    if archives and os.path.exists(dest):
        say(f"{dest} already exists: left as it is (delete it to download {name} again)")
        return root
    try:
        os.makedirs(os.path.join(root, SCRATCH), exist_ok=True)
    except OSError as e:
        raise DataError(f"--root {root} cannot be written ({e.strerror or e}); choose a writable folder") from None
    for remote in source.files:
        final = os.path.join(dest, remote.name)
        if not remote.unpack and os.path.exists(final):
            problem = verify(final, remote)
            if problem:
                raise DataError(f"{final} exists but is not the source's file ({problem}); delete it and run "
                                "the same command again")
            say(f"{final}: present and verified")
            continue
        part = os.path.join(root, SCRATCH, remote.name + ".part")
        url = url_of(remote, mirror)
        complete = os.path.exists(part) and verify(part, remote) is None   # finished, or copied in by hand
        if complete:
            say(f"{name}: {part} is complete")
        else:
            say(f"{name}: {url} ({size_text(remote)})")
            download(url, part, say, opener)
        problem = None if complete else verify(part, remote)   # a complete .part was hashed just now
        if problem:
            rejected = os.path.join(root, SCRATCH, remote.name + ".rejected")
            os.replace(part, rejected)
            raise DataError(f"{url} is not the file {name} needs: {problem}. Nothing was placed where a run "
                            f"reads; the download was moved to {rejected} (delete it). Run the same command "
                            "again; if it repeats, the server or mirror serves another file")
        say(f"  verified ({checksum_text(remote).split(' ')[0]} matches)")
        if remote.unpack:
            unpack(part, remote.unpack, root, source.folder)
            os.remove(part)
            say(f"  unpacked into {dest}")
        else:
            os.makedirs(dest, exist_ok=True)
            os.replace(part, final)
    try:
        os.rmdir(os.path.join(root, SCRATCH))
    except OSError:
        pass  # holds a rejected file or another dataset's .part: keep it
    return root
