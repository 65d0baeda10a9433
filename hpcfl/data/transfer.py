"""One file over HTTP(S) into its ``.part``: resumed, bounded by the published size, timed.

A server (or whatever answers in its place) decides what it sends and how fast, so the download
holds it to three bounds:

* **the published size**: bytes are read up to it and not one more; a server that announces or
  sends more is refused (:class:`TooLong`) and the ``.part`` removed, so that a rerun starts over
  rather than resuming garbage (an endless body once filled the filesystem, every rerun again);
* **a stall**: no byte for :attr:`Limits.stall_s` seconds (the socket's timeout, connecting and
  every read) ends the download;
* **a rate floor**: fewer than :attr:`Limits.min_rate` bytes a second on average over a window of
  :attr:`Limits.window_s` seconds ends it too (a byte every few seconds never trips the stall).

Both time limits keep the ``.part``, a valid prefix of the file, for the next run to resume.
They are read from ``HPCFL_DATA_STALL_S``, ``HPCFL_DATA_MIN_RATE`` and
``HPCFL_DATA_RATE_WINDOW_S`` (:meth:`Limits.from_env`; docs/guide.md, "Getting a dataset").
"""

from __future__ import annotations

import http.client
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import DataError
from .scratch import Scratch

MIRROR_ENV = "HPCFL_DATA_MIRROR"
_BLOCK = 1 << 20
# what each limit is called in the environment, and its default
_ENV = {"stall_s": ("HPCFL_DATA_STALL_S", 60.0), "min_rate": ("HPCFL_DATA_MIN_RATE", 1000.0),
        "window_s": ("HPCFL_DATA_RATE_WINDOW_S", 120.0)}


@dataclass(frozen=True)
class Limits:
    """When a download that still moves is given up.

    ``stall_s``: seconds without a byte (60); ``min_rate``: bytes per second, on average over each
    ``window_s`` seconds (1,000 over 120: a 2.4 GB file at that pace would take four weeks, while
    a byte every few seconds is caught within a few minutes); 0 switches the floor off.
    """

    stall_s: float = _ENV["stall_s"][1]
    min_rate: float = _ENV["min_rate"][1]
    window_s: float = _ENV["window_s"][1]

    @classmethod
    def from_env(cls, env=None) -> Limits:
        """The limits as the environment sets them, the defaults otherwise.

        Raises
        ------
        DataError
            For a value that is not a number, or not positive (``min_rate`` may be 0).
        """
        env = os.environ if env is None else env
        values = {}
        for field, (name, default) in _ENV.items():
            text = env.get(name, "").strip()
            try:
                value = float(text) if text else default
            except ValueError:
                value = -1.0
            if not math.isfinite(value) or not (value > 0 or (field == "min_rate" and value == 0)):
                unit = "bytes per second (0: no floor)" if field == "min_rate" else "seconds"
                raise DataError(f"{name}={text!r} is not a positive number of {unit}; unset it for the default "
                                f"({default:g}) or set e.g. {name}={default:g}")
            values[field] = value
        return cls(**values)


class TooLong(DataError):
    """The server sent (or announced) more than the file's published size."""


class _NoDowngrade(urllib.request.HTTPRedirectHandler):
    """Follows redirects, except from https to anything else: that would undo the https address."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if req.full_url.startswith("https://") and not newurl.startswith("https://"):
            raise DataError(f"{req.full_url} redirects to {newurl}, which is not https; refused (anyone on the "
                            f"way could change the file). Download it elsewhere, or set ${MIRROR_ENV} to a mirror")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def urlopen(req, timeout: float):
    """``urllib.request.urlopen``, with :class:`_NoDowngrade` for redirects."""
    return urllib.request.build_opener(_NoDowngrade).open(req, timeout=timeout)


def download(url: str, scratch: Scratch, part: str, size: int, say: Callable[[str], None],
             opener=urlopen, limits: Limits = Limits()) -> None:
    """Fetch ``url`` into ``scratch``'s ``part``, resuming from what it holds (less than ``size``).

    Raises
    ------
    DataError
        On an HTTP error, no connection, or a transfer that broke off, stalled or crawled (the
        ``.part`` is kept: the same command resumes it); :class:`TooLong` when the server sends
        more than ``size`` bytes (the ``.part`` is removed).
    """
    have = scratch.size(part) or 0
    resp = _connect(url, have, scratch.path(part), opener, limits)
    if resp is None:
        return
    with resp:
        resumed = bool(have) and getattr(resp, "status", 200) == 206
        if have and not resumed:
            say(f"  the server does not resume downloads: starting {part} over")
        elif resumed:
            say(f"  resuming after {have:,} bytes")
        got = have if resumed else 0
        try:
            end = _announced_end(resp, got, size, url)
            with scratch.file(part, "append" if resumed else "new") as f:
                _copy(resp, f, got, (size, end), url, say, limits)
        except TooLong:
            scratch.remove(part)
            raise


def _connect(url: str, have: int, part_path: str, opener, limits: Limits):
    """The server's answer to a request for ``url`` from byte ``have``; None when it says there is
    nothing more to send (HTTP 416: the verification that follows judges the ``.part``)."""
    req = urllib.request.Request(url, headers={"User-Agent": "hpcfl-data-get"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        return opener(req, timeout=limits.stall_s)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:
            return None
        raise DataError(f"{url}: HTTP {e.code} {e.reason}; check the address (hpcfl data list) or the "
                        f"mirror (${MIRROR_ENV}, --mirror)") from None
    except TimeoutError:
        raise DataError(f"{url} did not answer within {limits.stall_s:g} s (HPCFL_DATA_STALL_S); run the same "
                        f"command again later, or set ${MIRROR_ENV} to a mirror") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise DataError(f"cannot reach {url} ({reason}); this machine may have no internet: download the "
                        f"file elsewhere and copy it to {part_path} (then run the same command), or set "
                        f"${MIRROR_ENV} to a mirror") from None


def _too_long(url: str, size: int, announced: int | None = None) -> TooLong:
    said = f" (it announced {announced:,})" if announced is not None else ""
    return TooLong(f"the server sent more than the published size of {size:,} bytes for {url}{said}, so it is "
                   "not the source's file; the download was removed, and the next try starts over. If it "
                   "repeats, the server or mirror serves another file (hpcfl data list shows the source)")


def _announced_end(resp, got: int, size: int, url: str) -> int | None:
    """Where the answer says the file ends (its Content-Length after ``got``), None if it does not
    say; an answer that would go past the published size is refused before it is read."""
    length = resp.headers.get("Content-Length")
    if length is None or not length.strip().isdigit():
        return None
    if got + int(length) > size:
        raise _too_long(url, size, got + int(length))
    return got + int(length)


def _copy(resp, f, got: int, ends: tuple, url: str, say: Callable[[str], None], limits: Limits) -> int:
    """Append the body to ``f`` up to the published size in all; the bytes the file then has.

    ``ends``: the published size, and where the answer said it would end (None: not said). A body
    that ends before it said is a broken connection (the ``.part`` is kept to resume); one that
    ends where it said but short of the published size is left to the checksum to refuse.
    """
    size, end = ends
    pace = _Pace(limits, url)
    tenth = got * 10 // size if size else 0
    while got < size:
        block = _read(resp, min(_BLOCK, size - got), url, got, limits)
        if not block:
            break
        f.write(block)
        got += len(block)
        pace.add(len(block), got)
        if got * 10 // size > tenth and got < size:   # a line per tenth: minutes on 2 GB
            tenth = got * 10 // size
            say(f"  {10 * tenth}% ({got / 1e6:,.0f} of {size / 1e6:,.0f} MB)")
    if end is not None and got < end:
        raise DataError(f"the download of {url} broke off after {got:,} bytes; run the same command again "
                        "to resume it")
    if got == size and _more(resp):
        raise _too_long(url, size)
    return got


def _read(resp, n: int, url: str, got: int, limits: Limits) -> bytes:
    """At most ``n`` bytes, from one read of the socket: ``read(n)`` would wait for all ``n``, and
    the rate floor could not look at a drip in between."""
    try:
        return resp.read1(n)
    except TimeoutError:
        raise DataError(f"the download of {url} stalled: no byte for {limits.stall_s:g} s after {got:,} bytes; "
                        "the .part is kept: run the same command again to resume it (HPCFL_DATA_STALL_S sets "
                        "the wait)") from None
    except (OSError, http.client.HTTPException) as e:   # a reset, IncompleteRead
        raise DataError(f"the download of {url} broke off after {got:,} bytes ({type(e).__name__}); "
                        "run the same command again to resume it") from None


def _more(resp) -> bool:
    """Whether the body goes on past the published size (one byte more is enough to know)."""
    try:
        return bool(resp.read1(1))
    except (OSError, http.client.HTTPException):
        return False   # a body that ends badly once the file is whole: the checksum judges the file


class _Pace:
    """The rate floor: bytes counted over consecutive windows of ``limits.window_s`` seconds."""

    def __init__(self, limits: Limits, url: str):
        self.limits, self.url = limits, url
        self.start, self.count = time.monotonic(), 0

    def add(self, n: int, got: int) -> None:
        if not self.limits.min_rate:
            return
        self.count += n
        elapsed = time.monotonic() - self.start
        if elapsed < self.limits.window_s:
            return
        if self.count < self.limits.min_rate * elapsed:
            raise DataError(f"the download of {self.url} is too slow: slower than {self.limits.min_rate:,.0f} "
                            f"bytes/s over {self.limits.window_s:g} s ({self.count:,} bytes in {elapsed:.1f} s), "
                            f"after {got:,} bytes; the .part is kept: run the same command again to resume it, "
                            "from a faster connection or mirror (HPCFL_DATA_MIN_RATE and HPCFL_DATA_RATE_WINDOW_S "
                            "set the floor)")
        self.start, self.count = time.monotonic(), 0
