"""Sharded checkpoints: every rank writes and hashes its own clients' rows; rank 0 writes the manifest last.

A checkpoint of per-client state (SCAFFOLD's control variates, FedDyn's gradients, ...) is N rows.
Sent through rank 0, its save time follows the total state whatever the rank count. Here each rank
writes, fsyncs, reads back and hashes a shard of the rows it owns, all ranks at once, and rank 0
writes a small manifest that names every shard with its checksum. The manifest's rename into place
is the one atomic step, as in PyTorch's distributed checkpoints (metadata last) and LLNL SCR: a
checkpoint whose manifest is there is complete; shards without their manifest are an interrupted
save's debris and are removed (:func:`debris`).

Layout (format_version 2)::

    ckpt-<round:08d>.h5                         the manifest: a one-file checkpoint's root attributes
                                                and /arrays (model, server.*) without the client
                                                tables, plus ``shards`` (JSON list by rank:
                                                {"name", "sha256", "bytes"}), ``shard_token`` and
                                                ``shard_clients`` (N, the rows of every table)
    ckpt-<round:08d>.<token>.shard-<rank:05d>.h5
                                                root attributes as a checkpoint's, format_version 2,
                                                ``shard`` (the rank) and ``shard_token``;
                                                /arrays/rows (k, 2) int64: the runs [lo, hi) of client
                                                ids it holds, ascending; /arrays/clients.<name>
                                                (sum of hi - lo, width): their rows in that order

``token`` is 8 random hex digits drawn for each save, so that a save never writes over the shard of
an earlier save of the same round (one that a manifest may still name). A rank that resumes reads
the rows of the clients it owns now from whichever shards hold them (:class:`ShardRows`): any rank
count, any placement, nothing sent through rank 0.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcfl.errors import HpcflError
from hpcfl.io import safefs
from hpcfl.io.ckptblocks import Streamed
from hpcfl.io.ckptfile import SHARDED_VERSION, _Invalid, _open_h5, _to_json, read_open, room_for, write_file

COMPARE = 1 << 20   # bytes compared at a time when a shard is read back
SHARD_RE = re.compile(r"^ckpt-(\d{8,})\.([0-9a-f]{8})\.shard-(\d{5,})\.h5$")


def shard_name(round: int, token: str, rank: int) -> str:
    return f"ckpt-{int(round):08d}.{token}.shard-{int(rank):05d}.h5"


def new_token() -> str:
    return os.urandom(4).hex()


@dataclass
class Shard:
    """One verified shard of a manifest: its file, checksum, size and the runs of client ids it holds.

    ``rows`` (k, 2) int64: runs [lo, hi), ascending; its table rows are those clients' in that order.
    """

    path: Path
    sha256: str
    nbytes: int
    rows: np.ndarray


def write(folder: Path, round: int, token: str, rank: int, arrays: dict, manifest: dict) -> dict:
    """Write this rank's shard into ``folder`` (temporary name, fsync, rename, fsync the folder), read it
    back and compare it with what was written. ``arrays``: ``rows`` and ``clients.<name>`` (np.ndarray or
    :class:`~hpcfl.io.ckptblocks.Streamed`); ``manifest``: the checkpoint's world_size, config_sha256
    and versions.

    Returns ``{"name", "sha256", "bytes"}``, what the manifest records of it. Raises
    :class:`HpcflError` (nothing of this shard left behind) when the write or the check fails.
    """
    name = shard_name(round, token, rank)
    final, tmp = folder / name, folder / f".{name}.tmp-{os.getpid()}"
    nbytes = sum(a.nbytes for a in arrays.values())
    attrs = {"format_version": SHARDED_VERSION, "round": int(round), "world_size": int(manifest["world_size"]),
             "config_sha256": str(manifest["config_sha256"]), "versions": _to_json(manifest["versions"]),
             "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "payload_sha256": "", "meta": "{}", "shard": _to_json(int(rank)), "shard_token": _to_json(token)}
    try:
        if not room_for(folder, nbytes):   # as a whole checkpoint's save: check first
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        digest = write_file(tmp, arrays, attrs)
        os.replace(tmp, final)
        safefs.fsync(folder, directory=True)
        _same_as_written(final, arrays, digest)
        return {"name": name, "sha256": digest, "bytes": final.stat().st_size}
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        final.unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError, _Invalid)):
            raise HpcflError(f"rank {rank} could not write its checkpoint shard {final} ({nbytes / 1e6:,.1f} MB): "
                             f"{e}") from None
        raise


def _same_as_written(path: Path, arrays: dict, digest: str) -> None:
    """Read the shard back and compare it, a block at a time, byte for byte with the rows it was written
    from (still in this rank's memory, unchanged during a save): the file holds exactly what was hashed.
    As strong as hashing it again, at the cost of a comparison (SHA-256 runs at about 0.4 GB/s here)."""
    with _open_h5(path, "r") as f:
        if f.attrs.get("payload_sha256") != digest or set(f["arrays"]) != set(arrays):
            raise _Invalid("the file read back is not the one written (its checksum or arrays differ)")
        for name, a in arrays.items():
            ds = f["arrays"][name]
            if tuple(ds.shape) != tuple(a.shape) or ds.dtype != a.dtype:
                raise _Invalid(f"/arrays/{name} read back is {ds.dtype} {ds.shape}, not {a.dtype} {a.shape}")
            blocks = Streamed(a.shape, a.dtype, a.blocks) if isinstance(a, Streamed) else [(0, len(a), a)]
            for r0, r1, rows in blocks:
                got = ds[r0:r1].reshape(-1).view(np.uint8)
                want = np.ascontiguousarray(rows).reshape(-1).view(np.uint8)
                # in 1 MB pieces: array_equal's temporary is one bool a byte (a whole block would double it)
                if got.size != want.size or not all(np.array_equal(got[o:o + COMPARE], want[o:o + COMPARE])
                                                    for o in range(0, got.size, COMPARE)):
                    raise _Invalid(f"/arrays/{name} rows {r0}..{r1 - 1} read back differ from those written")
                del got, want   # before the next block is read: one block in memory, not two


def verify(folder: Path, manifest: dict, round: int, shapes: dict) -> list[Shard]:
    """Check every shard a manifest names: present, its size and checksum the manifest's, a valid
    checkpoint-format file of this round and save, and together holding every client's row of every
    table exactly once. Adds each ``clients.<name>`` (N, width) to ``shapes``; returns the shards.
    Raises :class:`_Invalid` naming the shard and what is wrong."""
    entries, token, clients = manifest["shards"], manifest.get("shard_token"), manifest.get("shard_clients")
    if not isinstance(entries, list) or not entries or not isinstance(token, str) or not isinstance(clients, int):
        raise _Invalid("its shard list is empty or malformed")
    shards, tables = [], None
    for rank, e in enumerate(entries):
        if not isinstance(e, dict) or not {"name", "sha256", "bytes"} <= set(e) or \
                e["name"] != shard_name(round, token, rank):
            raise _Invalid(f"its shard list's entry {rank} is malformed")
        path = folder / e["name"]
        try:
            size = path.stat().st_size
            if size != e["bytes"]:
                raise _Invalid(f"shard {e['name']} is {size:,} bytes, the manifest says {e['bytes']:,} "
                               f"(truncated or replaced)")
            with _open_h5(path, "r") as f:
                got = read_open(f, path, keep_arrays=False, shard=True)
                shape = got.shapes.get("rows", ((), None))[0]
                rows = np.asarray(f["arrays"]["rows"][()]) if len(shape) == 2 and shape[1] == 2 else None
        except FileNotFoundError:
            raise _Invalid(f"shard {e['name']} is missing") from None
        except _Invalid as why:
            raise _Invalid(f"shard {e['name']}: {why}") from None
        except Exception as why:   # a damaged file can make h5py raise anything
            raise _Invalid(f"shard {e['name']} is unreadable: {type(why).__name__}: {why}") from None
        if got.manifest["payload_sha256"] != e["sha256"]:
            raise _Invalid(f"shard {e['name']}'s checksum is not the one the manifest recorded (altered or replaced)")
        if got.round != round or got.manifest.get("shard") != rank or got.manifest.get("shard_token") != token:
            raise _Invalid(f"shard {e['name']} belongs to another save (its round, rank or token differ)")
        if rows is None or rows.dtype.kind != "i" or np.any(rows[:, 1] < rows[:, 0]):
            raise _Invalid(f"shard {e['name']} has no valid /arrays/rows (k, 2) of client runs")
        mine = {k: v for k, v in got.shapes.items() if k.startswith("clients.")}
        held = int((rows[:, 1] - rows[:, 0]).sum())
        widths = {k: (shape[1:], dtype) for k, (shape, dtype) in mine.items()}   # what every shard must share
        if any(len(shape) != 2 or shape[0] != held for shape, _ in mine.values()) or \
                (tables is not None and widths != tables):
            raise _Invalid(f"shard {e['name']}'s tables do not match its client runs or the other shards'")
        tables = widths
        shards.append(Shard(path, e["sha256"], int(e["bytes"]), rows.astype(np.int64)))
    runs = np.concatenate([sh.rows for sh in shards]).reshape(-1, 2)
    runs = runs[np.argsort(runs[:, 0], kind="stable")]
    n = int(runs[-1, 1]) if len(runs) else 0
    if n != clients or (len(runs) and (runs[0, 0] != 0 or np.any(runs[1:, 0] != runs[:-1, 1]))):
        raise _Invalid("its shards do not hold every client's row exactly once")
    for k, (width, dtype) in (tables or {}).items():
        shapes[k] = ((n, *width), dtype)
    return shards


def whole_tables(shards: list[Shard], shapes: dict) -> dict:
    """Every ``clients.<name>`` table of a verified sharded checkpoint, whole, in client-id order
    (``load_latest(keep_arrays=True)``: tests and small states; a resume reads by blocks instead)."""
    rows = ShardRows(shards)
    try:
        out = {}
        for name, (shape, dtype) in shapes.items():
            if name.startswith("clients."):
                out[name] = np.empty(shape, dtype=dtype)
                for c0, c1, k, first in rows.pieces(0, shape[0]):
                    out[name][c0:c1] = rows.block(k, name, first, first + c1 - c0)
        return out
    finally:
        rows.close()


def debris(names: list[str], manifests: dict) -> list[str]:
    """The shard files among ``names`` that no manifest there names: their save was interrupted before
    its manifest, or its manifest was rotated away or replaced. ``manifests`` maps a round to the
    names its manifest lists (None when it could not be read: its shards are kept for inspection)."""
    out = []
    for n in names:
        m = SHARD_RE.match(n)
        if m is None:
            continue
        listed = manifests.get(int(m.group(1)), ())
        if listed is not None and n not in listed:
            out.append(n)
    return out


def listed_shards(path: Path) -> list[str] | None:
    """The shard names manifest ``path`` lists ([] for a one-file checkpoint), None when unreadable."""
    try:
        with _open_h5(path, "r") as f:
            text = f.attrs.get("shards")
            if text is None:
                return []
            got = json.loads(text)
        return [e["name"] for e in got]
    except Exception:   # a damaged manifest: nothing of it is trusted, and nothing deleted for it
        return None


class ShardRows:
    """The rows of a sharded checkpoint's tables by client id, read from whichever shards hold them.

    Parameters
    ----------
    shards : list of :class:`Shard`
        What rank 0 verified, sent to every rank. A rank opens a shard only when it needs rows from
        it, and only if its size and stored checksum are still the verified ones.
    """

    def __init__(self, shards: list[Shard]):
        self.shards = shards
        runs = []
        for i, sh in enumerate(shards):   # (lo, hi, shard, its first row): a shard's runs follow each other
            first = np.concatenate([[0], np.cumsum(sh.rows[:, 1] - sh.rows[:, 0])[:-1]])
            runs += [(int(lo), int(hi), i, int(off)) for (lo, hi), off in zip(sh.rows, first)]
        self.runs = sorted(runs)
        self.starts = np.array([r[0] for r in self.runs], dtype=np.int64)
        self.files = {}

    def pieces(self, lo: int, hi: int):
        """``(c0, c1, shard, first)``: clients c0..c1-1 of [lo, hi) are rows first.. of ``shard``."""
        i = max(0, int(np.searchsorted(self.starts, lo, side="right")) - 1)
        while lo < hi:
            rlo, rhi, shard, off = self.runs[i]
            c1 = min(hi, rhi)
            yield lo, c1, shard, off + (lo - rlo)
            lo, i = c1, i + 1

    def block(self, shard: int, name: str, r0: int, r1: int) -> np.ndarray:
        return np.ascontiguousarray(self._file(shard)["arrays"][name][r0:r1])

    def _file(self, shard: int):
        if shard not in self.files:
            path, sh = self.shards[shard].path, self.shards[shard]
            try:
                if os.stat(path).st_size != sh.nbytes:
                    raise OSError("its size changed since it was verified")
                f = _open_h5(path, "r")
                if f.attrs.get("payload_sha256") != sh.sha256:
                    f.close()
                    raise OSError("it was replaced since it was verified")
            except OSError as e:
                raise HpcflError(f"cannot read checkpoint shard {path}: {e}; run the same command again to resume "
                                 f"from the newest valid checkpoint") from None
            self.files[shard] = f
        return self.files[shard]

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files = {}

