"""``hpcfl data get``: download a dataset from its source, verify it, unpack it safely.

For each file of a :class:`~hpcfl.data.sources.Source`:

1. **Download** into ``<root>/.hpcfl_download/<file>.part`` (:mod:`hpcfl.data.transfer`): a
   ``.part`` left by an interrupted download is resumed with an HTTP ``Range`` request; the
   transfer stops at the published size and gives up on a stalled or crawling server. The folder
   must be this user's alone, and a ``.part`` a regular file (:mod:`hpcfl.data.scratch`).
2. **Verify** size and checksum (md5 and/or sha256, as the source publishes). A ``.part`` that
   already has the published size (finished, or copied in by hand) is verified before any network
   access. A wrong file is moved aside to ``<file>.rejected`` (never where a run reads) and
   :class:`DataError` says so.
3. **Place** it: a plain file is renamed into ``<root>/<folder>/`` (one atomic rename); an
   archive is unpacked into a scratch folder inside ``root`` and the finished folder renamed
   into place, so a run never sees half a dataset. Members that are links, devices, absolute
   paths or climb out with ``..`` refuse the whole archive.

Ctrl-C ends it with :class:`Interrupted` (exit 75, run again to resume), the ``.part`` kept.
Nothing here imports above the data layer; the command line is :mod:`hpcfl.cli.data_cmd`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Callable

from ..errors import EXIT_RESUMABLE, DataError
from ..inputs import open_regular
from .scratch import SCRATCH, Scratch
from .sources import Remote, Source
from .transfer import MIRROR_ENV, Limits, download, urlopen

__all__ = ["MIRROR_ENV", "SCRATCH", "Interrupted", "get", "unpack", "verify"]
_BLOCK = 1 << 20


class Interrupted(DataError):
    """Ctrl-C stopped ``hpcfl data get``; what was downloaded is kept, and the same command resumes."""

    exit_code = EXIT_RESUMABLE


def url_of(remote: Remote, mirror: str | None) -> str:
    """The URL to fetch: the source's, or ``<mirror>/<file name>``."""
    return remote.url if not mirror else mirror.rstrip("/") + "/" + remote.name


def size_text(remote: Remote) -> str:
    size = remote.size
    scale, unit = (1e9, "GB") if size >= 1e9 else (1e6, "MB") if size >= 1e6 else (1e3, "kB")
    return f"{size:,} bytes ({size / scale:.1f} {unit})"


def checksum_text(remote: Remote) -> str:
    return ", ".join(f"{k} {v}" for k, v in (("sha256", remote.sha256), ("md5", remote.md5)) if v)


def _digests(f):
    """md5 and sha256 of the open binary file ``f``, read from where it is to its end."""
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    while block := f.read(_BLOCK):
        md5.update(block)
        sha.update(block)
    return md5, sha


def verify_file(f, remote: Remote) -> str | None:
    """None when the open file ``f`` is the source's file, else what is wrong (size or checksum)."""
    size = os.fstat(f.fileno()).st_size
    if size != remote.size:
        return f"{size:,} bytes where the source's file has {remote.size:,}"
    md5, sha = _digests(f)
    for name, want, got in (("sha256", remote.sha256, sha), ("md5", remote.md5, md5)):
        if want and got.hexdigest() != want.lower():
            return f"{name} {got.hexdigest()} where the source's file has {want}"
    return None


def verify(path: str, remote: Remote) -> str | None:
    """:func:`verify_file` of the regular file at ``path`` (a FIFO there is refused, never waited on)."""
    try:
        with open_regular(path) as f:
            return verify_file(f, remote)
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"


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


def _unpack_tar(path: str, into: str, fileobj=None) -> None:
    try:
        with tarfile.open(None if fileobj else path, "r:*", fileobj=fileobj) as tf:
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


def _unpack_zip(path: str, into: str, fileobj=None) -> None:
    try:
        with zipfile.ZipFile(fileobj or path) as zf:
            infos = zf.infolist()
            for info in infos:
                _safe_name(info.filename, path)
                # The file type is in the high bits of a Unix mode; a member with none (zipfile.writestr's
                # and Windows tools', which record no Unix mode at all) is a plain file or folder.
                kind = stat.S_IFMT(info.external_attr >> 16)
                if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                    raise DataError(f"{path}: member {info.filename!r} is a link or special file; refusing the "
                                    "archive (hpcfl unpacks only plain files and folders)")
            _write_members(((i.filename, i.is_dir(), lambda i=i: zf.open(i)) for i in infos), into, path)
    except (zipfile.BadZipFile, EOFError, OSError) as e:
        raise DataError(f"{path} is not a readable zip archive ({type(e).__name__}: {e})") from None


def unpack(path: str, kind: str, root: str, folder: str, fileobj=None) -> None:
    """Unpack archive ``path`` so that its files end up in ``root/folder``, all or nothing.

    Members are checked before anything is written (no link, device, absolute path or
    ``..``); the files go to a scratch folder inside ``root`` that is renamed into place.
    ``fileobj``: the archive, already open (``path`` then only names it in messages).
    """
    scratch = tempfile.mkdtemp(prefix=".hpcfl_unpack_", dir=root)
    try:
        (_unpack_tar if kind == "tar" else _unpack_zip)(path, scratch, fileobj)
        top = os.listdir(scratch)
        made = os.path.join(scratch, folder) if top == [folder] else scratch
        if made == scratch:
            os.chmod(scratch, 0o755)   # mkdtemp makes it 0700
        os.rename(made, os.path.join(root, folder))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------------ the command


def get(name: str, source: Source, root: str, mirror: str | None = None,
        say: Callable[[str], None] = print, opener=urlopen, limits: Limits | None = None) -> str:
    """Download, verify and place dataset ``name`` under ``root``; returns ``root`` (absolute).

    ``limits``: when a slow download is given up (default: :meth:`Limits.from_env`).

    Raises
    ------
    DataError
        For anything the user must act on (no network, a wrong file, a folder in the way, a
        planted link); a wrong file is moved to ``<root>/.hpcfl_download/<file>.rejected``.
    Interrupted
        On Ctrl-C (KeyboardInterrupt), with what was kept and how to resume.
    """
    root = os.path.abspath(root)
    dest = os.path.join(root, source.folder)
    if any(r.unpack for r in source.files) and os.path.exists(dest):
        say(f"{dest} already exists: left as it is (delete it to download {name} again)")
        return root
    limits = limits or Limits.from_env()
    scratch = Scratch(root)
    remote = None
    try:
        for remote in source.files:
            _get_file(name, source, remote, scratch, root, url_of(remote, mirror), say, opener, limits)
    except KeyboardInterrupt:
        raise Interrupted(_kept(scratch, remote)) from None
    finally:
        scratch.close(tidy=True)   # kept where it holds a rejected file or another file's .part
    return root


def _get_file(name: str, source: Source, remote: Remote, scratch: Scratch, root: str, url: str,
              say: Callable[[str], None], opener, limits: Limits) -> None:
    """Download (unless present), verify and place one file of ``source``."""
    final = os.path.join(root, source.folder, remote.name)
    if not remote.unpack and os.path.exists(final):
        problem = verify(final, remote)
        if problem:
            raise DataError(f"{final} exists but is not the source's file ({problem}); delete it and run "
                            "the same command again")
        say(f"{final}: present and verified")
        return
    part = remote.name + ".part"
    have = scratch.size(part)
    if have is not None and have >= remote.size:   # finished, or copied in by hand: judged offline
        _verified(scratch, part, remote, f"{scratch.path(part)} is complete but is not the source's file", "")
        say(f"{name}: {scratch.path(part)} is complete")
    else:
        say(f"{name}: {url} ({size_text(remote)})")
        download(url, scratch, part, remote.size, say, opener, limits)
        _verified(scratch, part, remote, f"{url} is not the file {name} needs",
                  "; if it repeats, the server or mirror serves another file")
    say(f"  verified ({checksum_text(remote).split(' ')[0]} matches)")
    if remote.unpack:
        with scratch.file(part) as f:
            unpack(scratch.path(part), remote.unpack, root, source.folder, fileobj=f)
        scratch.remove(part)
        say(f"  unpacked into {os.path.join(root, source.folder)}")
    else:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        scratch.move_out(part, final)


def _verified(scratch: Scratch, part: str, remote: Remote, what: str, then: str) -> None:
    """Check ``part`` against the source's size and checksum; a wrong one is moved to ``.rejected``
    and DataError says ``what``, the problem, where the file went, and ``then``."""
    with scratch.file(part) as f:
        problem = verify_file(f, remote)
    if problem:
        rejected = remote.name + ".rejected"
        scratch.rename(part, rejected)
        raise DataError(f"{what}: {problem}. Nothing was placed where a run reads; it was moved to "
                        f"{scratch.path(rejected)} (delete it). Run the same command again to download the file{then}")


def _kept(scratch: Scratch, remote: Remote | None) -> str:
    """What Ctrl-C left: the ``.part`` of the file in progress, kept only as a valid prefix."""
    if remote is None:
        return "interrupted before any download; run the same command again"
    part = remote.name + ".part"
    try:
        have = scratch.size(part)
    except DataError:
        have = None
    if have is None:   # before its download began, or once it was placed
        return ("interrupted; what is already in place was verified, nothing half written was placed: run the "
                "same command again to finish")
    if have > remote.size:   # not a prefix of the source's file: resuming it would be pointless
        scratch.remove(part)
        return f"interrupted; the download of {remote.name} was removed: run the same command again"
    if have == remote.size:
        return f"interrupted: {scratch.path(part)} is complete and kept; run the same command again to finish"
    return (f"interrupted: the {have:,} bytes of {remote.name} downloaded so far are kept in {scratch.path(part)}; "
            "run the same command again to resume")
