"""``tff``: TensorFlow Federated's HDF5 client data, one client per ``examples/<client id>`` group.

TFF's ``.h5`` archives (``fed_emnist.tar.bz2``, ``shakespeare.tar.bz2``, ``stackoverflow.tar.bz2``
at storage.googleapis.com/tff-datasets-public/; later TFF releases moved to SQLite, not read here)
hold one group per client, ``examples/<client id>/<feature>``, every feature one dataset with one
row per example:

* EMNIST-62 (``fed_emnist_train.h5``, ``fed_emnist_test.h5``): ``pixels`` float32 (n, 28, 28) and
  ``label`` int32 (n,); ``features = "image"`` reads x and y as they are stored (float32, no
  rescaling) and adds a channel axis to 2-D rows, (28, 28) -> (1, 28, 28), unless ``image_shape``
  says otherwise;
* Shakespeare (``shakespeare_train.h5``, ``shakespeare_test.h5``): ``snippets``, one variable-length
  UTF-8 byte string per row (a speaking part's line); ``features = "chars"`` turns every snippet into
  windows of ``seq_len`` characters labelled with the next one, starting every ``stride`` characters
  (:func:`hpcfl.data.chars.windows`; a snippet of ``seq_len`` characters or fewer gives none), over
  ``vocab`` with ``unknown = "map"`` by default (TFF's snippets hold characters LEAF's 80 lack).

Clients are the training file's clients with rows, in ascending id order; a client's rows in the
test file are its own test rows (:mod:`hpcfl.data.clients`). Images are read client by client
straight into arrays allocated once for all clients (HDF5 converts the type as it reads); only the
snippets, variable-length strings, become Python objects, one client at a time. A malformed file
is a :class:`DataError` naming the file, the client and the feature.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError
from .chars import LEAF_CHARS, UNKNOWN, CharCodec, vocab_problems, windows
from .clients import consecutive, listing, natural_groups, resolve
from .container import Dataset
from .disk import _open

_LAYOUT = "TFF's HDF5 client data: a group examples/<client id>/ holding one dataset per feature"


@dataclass(frozen=True)
class TffOptions:
    train: str = field(default="fed_emnist_train.h5", metadata={
        "help": "the training clients' .h5 file (Shakespeare: shakespeare_train.h5); absolute or relative to "
                "data.root"})
    test: str = field(default="fed_emnist_test.h5", metadata={
        "help": "the test .h5 file: each client's own test rows (Shakespeare: shakespeare_test.h5)"})
    features: str = field(default="image", metadata={
        "choices": ("image", "chars"),
        "help": "image: x and y numeric (EMNIST); chars: x a byte string per row, windows of seq_len characters "
                "labelled with the next (Shakespeare)"})
    x: str = field(default="", metadata={
        "help": "the input feature's name; empty: pixels (image), snippets (chars)"})
    y: str = field(default="label", metadata={"help": "image: the label feature's name"})
    image_shape: tuple[int, ...] = field(default=(), metadata={
        "gt": 0, "help": "shape of one x row; []: as stored, with a channel axis added to 2-D rows ((28, 28) -> "
                         "(1, 28, 28))"})
    seq_len: int = field(default=80, metadata={"gt": 0, "help": "chars: characters per window (80 in LEAF)"})
    stride: int = field(default=0, metadata={
        "ge": 0, "help": "chars: characters from one window's start to the next; 0: seq_len (no overlap)"})
    vocab: str = field(default=LEAF_CHARS, metadata={
        "help": "chars: the characters, id = position (default: LEAF's 80)"})
    unknown: str = field(default="map", metadata={
        "choices": UNKNOWN, "help": "chars: a character outside vocab becomes id len(vocab) (map) or is an error"})
    num_classes: int = field(default=0, metadata={
        "ge": 0, "help": "number of classes; 0: image: the largest label + 1, chars: the vocabulary's ids"})

    def validate(self) -> list[str]:
        return vocab_problems(self.vocab, "vocab") if self.features == "chars" else []


def open_h5(path: str):
    """``path`` as a read-only h5py File: a regular file (:func:`hpcfl.data.disk._open`) that is HDF5."""
    import h5py

    _open(path, _LAYOUT).close()   # missing, unreadable or not a regular file: a DataError
    try:
        return h5py.File(path, "r", locking=False)   # an input no one writes: no lock to take
    except OSError as e:
        raise DataError(f"{path} cannot be opened as HDF5 ({e}); expected {_LAYOUT}") from None


def clients_of(f, path: str) -> tuple[object, list[str]]:
    """The ``examples`` group and its client ids in ascending order."""
    import h5py

    ex = f.get("examples")
    if not isinstance(ex, h5py.Group):
        has = ", ".join(sorted(f.keys())) or "nothing"
        raise DataError(f"{path} has no group 'examples' (has {has}); expected {_LAYOUT}")
    return ex, sorted(ex.keys())


def feature(ex, path: str, cid: str, name: str, kinds: str, what: str):
    """Dataset ``examples/<cid>/<name>`` with one row per example and a dtype of kind in ``kinds``."""
    import h5py

    g = ex.get(cid)
    if not isinstance(g, h5py.Group):
        raise DataError(f"{path}: examples/{cid} is not a group; expected {_LAYOUT}")
    d = g.get(name)
    if not isinstance(d, h5py.Dataset):
        raise DataError(f"{path}: client {cid!r} has no feature {name!r} (has {', '.join(sorted(g.keys())) or 'none'})"
                        f"; set data.tff.x / data.tff.y to the feature names")
    if not d.shape:
        raise DataError(f"{path}: client {cid!r}, feature {name!r} is a scalar; expected one row per example")
    kind = "S" if h5py.check_string_dtype(d.dtype) is not None else d.dtype.kind
    if kind not in kinds:
        raise DataError(f"{path}: client {cid!r}, feature {name!r} has dtype {d.dtype}; expected {what}")
    return d


def _read(d, out: np.ndarray, path: str, cid: str, name: str) -> None:
    """Dataset ``d`` (a low-level DatasetID) into ``out`` (C-contiguous, as many values): HDF5 converts
    the stored type to ``out``'s as it reads, with no temporary."""
    from h5py import h5s

    try:
        d.read(h5s.ALL, h5s.ALL, out.reshape(d.shape))
    except (OSError, TypeError, ValueError) as e:
        raise DataError(f"{path}: client {cid!r}, feature {name!r} cannot be read ({e})") from None


def _open_features(f, ex, path: str, cid: str, names: tuple, kinds: tuple, what: tuple) -> list:
    """The datasets ``examples/<cid>/<name>`` as low-level DatasetIDs, the client's group opened once
    (h5py's objects cost about 0.1 ms each: at 100k clients, seconds); where one fails or has no rows or
    another kind of dtype, :func:`feature` says why."""
    # h5py is imported when a file is read, not with hpcfl.data
    from h5py import h5d, h5g

    try:
        g = h5g.open(ex.id, cid.encode())
        found = [h5d.open(g, n.encode()) for n in names]
    except (KeyError, ValueError, OSError, TypeError) as e:
        for n, k, w in zip(names, kinds, what):
            feature(ex, path, cid, n, k, w)   # raises the DataError that names the problem
        raise DataError(f"{path}: client {cid!r}, features {', '.join(names)} cannot be opened ({e}); expected "
                        f"{_LAYOUT}") from None
    for d, n, k, w in zip(found, names, kinds, what):
        if not d.shape or d.dtype.kind not in k:
            feature(ex, path, cid, n, k, w)
    return found


def read_images(path: str, xname: str, yname: str, row_shape: tuple | None):
    """(client ids with rows, rows per client, x (n, *stored row) float32, y (n,) int64) of one file.

    Two passes over the clients: their shapes (metadata only), then their rows, read straight into
    arrays allocated once for all; no dataset stays open between the passes."""
    names, kinds, what = (xname, yname), ("fiu", "iu"), ("numbers (float or integer)", "integer class labels")
    with open_h5(path) as f:
        ex, ids = clients_of(f, path)
        sizes = np.zeros(len(ids), dtype=np.int64)
        for i, cid in enumerate(ids):
            dx, dy = _open_features(f, ex, path, cid, names, kinds, what)
            n, shape = dx.shape[0], dx.shape[1:]
            if row_shape is None:
                row_shape = shape
            if shape != row_shape:
                raise DataError(f"{path}: client {cid!r}, feature {xname!r} has rows of shape {shape}; the "
                                f"first client's (and the training file's) are {row_shape}")
            if dy.shape[0] != n:
                raise DataError(f"{path}: client {cid!r} has {n} rows of {xname!r} but {dy.shape[0]} of {yname!r}; "
                                f"every feature of a client has one row per example")
            if dy.shape not in ((n,), (n, 1)):
                raise DataError(f"{path}: client {cid!r}, feature {yname!r} has shape {dy.shape}; expected ({n},)")
            sizes[i] = n
        total = int(sizes.sum())
        x = np.empty((total, *(row_shape or ())), dtype=np.float32)
        y = np.empty(total, dtype=np.int64)
        at = 0
        for cid, n in zip(ids, sizes.tolist()):
            if not n:
                continue
            block, labels = x[at:at + n], y[at:at + n]
            dx, dy = _open_features(f, ex, path, cid, names, kinds, what)
            _read(dx, block, path, cid, xname)
            _read(dy, labels, path, cid, yname)
            if not np.isfinite(block).all():
                r = int(np.argwhere(~np.isfinite(block))[0][0])
                raise DataError(f"{path}: client {cid!r}, feature {xname!r}, row {r} holds a value that is not finite "
                                f"in float32; inputs must be finite: fix or drop that row")
            if labels.min() < 0:
                r = int(np.argmin(labels))
                raise DataError(f"{path}: client {cid!r}, feature {yname!r}, row {r} = {int(labels[r])} is a "
                                f"negative label; labels are classes 0, 1, ...")
            at += n
    return ids, sizes, x, y, row_shape


def read_chars(path: str, xname: str, codec: CharCodec, seq_len: int, stride: int):
    """(client ids, windows per client, x (W, seq_len) ids as float32, y (W,) int64) of one file."""
    with open_h5(path) as f:
        ex, ids = clients_of(f, path)
        xs, ys, sizes = [], [], np.zeros(len(ids), dtype=np.int64)
        for i, cid in enumerate(ids):
            d = feature(ex, path, cid, xname, "S", "byte strings, one per row (TFF's snippets)")
            if len(d.shape) != 1:
                raise DataError(f"{path}: client {cid!r}, feature {xname!r} has shape {d.shape}; expected one "
                                f"string per row, shape (n,)")
            try:
                raw = d[()]
            except OSError as e:
                raise DataError(f"{path}: client {cid!r}, feature {xname!r} cannot be read ({e})") from None
            texts = []
            for r, b in enumerate(raw.tolist()):
                try:
                    texts.append(b.decode("utf-8") if isinstance(b, bytes) else str(b))
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}: client {cid!r}, feature {xname!r}, row {r} is not UTF-8 text ({e.reason} "
                                    f"at byte {e.start})") from None
            lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
            codes, bad = codec.encode("".join(texts))
            if bad >= 0:
                r = int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
                c = bad - int(lengths[:r].sum())
                raise DataError(f"{path}: client {cid!r}, feature {xname!r}, row {r}, character {c} is "
                                f"{texts[r][c]!r}, which is not in data.tff.vocab; add it, or set data.tff.unknown "
                                f"= 'map' to give such characters one extra id")
            wx, wy = windows(codes, lengths, seq_len, stride)
            xs.append(wx.astype(np.float32))
            ys.append(wy)
            sizes[i] = len(wy)
    x = np.concatenate(xs) if xs else np.zeros((0, seq_len), dtype=np.float32)
    y = np.concatenate(ys) if ys else np.zeros(0, dtype=np.int64)
    return ids, sizes, x, y


def _image_shape(opts: TffOptions, stored: tuple, path: str) -> tuple:
    if opts.image_shape:
        if int(np.prod(opts.image_shape)) != int(np.prod(stored)):
            raise DataError(f"data.tff.image_shape = {list(opts.image_shape)} does not hold the rows of {path}, of "
                            f"shape {stored}; give a shape with {int(np.prod(stored))} values")
        return tuple(opts.image_shape)
    if len(stored) == 2:
        return (1, *stored)   # (H, W) grey images: the channel axis the convolutional models expect
    return tuple(stored) or (1,)


def load_tff(opts: TffOptions, root: str | None, seed: int) -> Dataset:
    """The TFF client data of ``opts.train`` and ``opts.test``: one client per training client with rows."""
    train = listing(resolve(opts.train, root), (".h5", ".hdf5"), "data.tff.train", _LAYOUT)
    test = listing(resolve(opts.test, root), (".h5", ".hdf5"), "data.tff.test", _LAYOUT)
    for key, files in (("train", train), ("test", test)):
        if len(files) != 1:
            raise DataError(f"data.tff.{key}: {os.path.dirname(files[0])} holds {len(files)} .h5 files; name one")
    if opts.features == "chars":
        codec = CharCodec(opts.vocab, opts.unknown)
        xname = opts.x or "snippets"
        stride = opts.stride or opts.seq_len
        tr_ids, tr_sizes, xtr, ytr = read_chars(train[0], xname, codec, opts.seq_len, stride)
        te_ids, te_sizes, xte, yte = read_chars(test[0], xname, codec, opts.seq_len, stride)
        shape, needed, why = (opts.seq_len,), codec.size, f"the {codec.size} character ids"
    else:
        xname = opts.x or "pixels"
        tr_ids, tr_sizes, xtr, ytr, stored = read_images(train[0], xname, opts.y, None)
        te_ids, te_sizes, xte, yte, _ = read_images(test[0], xname, opts.y, stored)
        shape = _image_shape(opts, stored, train[0])
        top = int(max(ytr.max(initial=0), yte.max(initial=0)))
        needed, why = top + 1, f"labels up to {top}"
    for key, path, y in (("train", train[0], ytr), ("test", test[0], yte)):
        if not len(y):
            more = f" (no snippet is longer than data.tff.seq_len = {opts.seq_len})" if opts.features == "chars" else ""
            raise DataError(f"data.tff.{key}: {path} gives no rows{more}; expected {_LAYOUT}")
    num_classes = opts.num_classes or needed
    if num_classes < needed:
        raise DataError(f"data.tff.num_classes = {opts.num_classes} is too small for {why}; set it to at least "
                        f"{needed}, or 0 to have it found")
    clients, own_test, _ = natural_groups(tr_ids, consecutive(tr_sizes), tr_sizes, te_ids, consecutive(te_sizes),
                                          te_sizes)
    return Dataset(name="tff", x_train=xtr.reshape(-1, *shape), y_train=ytr, x_test=xte.reshape(-1, *shape),
                   y_test=yte, num_classes=num_classes, input_shape=shape, natural_clients=clients,
                   natural_test=own_test)
