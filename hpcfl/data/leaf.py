"""``leaf``: LEAF's JSON files (Caldas et al. 2018), one user per client.

LEAF's scripts (github.com/TalwalkarLab/leaf, ``data/<name>/preprocess.sh``) write each split as
JSON files in ``data/<name>/data/train/`` and ``.../test/``, each an object with

* ``users``: the user ids (strings), ``num_samples``: each one's row count, in the same order;
* ``user_data``: ``{id: {"x": [...], "y": [...]}}``, ``num_samples[i]`` rows each;
* optionally ``hierarchies`` (ignored here).

``features = "image"`` (FEMNIST, CelebA's attributes, ...): an x row is a flat list of numbers,
read as float32 as stored and reshaped to ``image_shape`` ([1, 28, 28] for FEMNIST; unset: flat);
y is an integer class. ``features = "chars"`` (Shakespeare): an x row is a string of characters (80
in LEAF) and y the next character; both become ids over ``vocab`` (:mod:`hpcfl.data.chars`).
``features = "tokens"`` (Sent140): an x row is a text, or a list whose last element is the text
(LEAF's Sent140 rows: tweet id, date, query, user, text), y an integer class; the text becomes
``seq_len`` word ids over ``vocab_file`` (:mod:`hpcfl.data.tokens`: 0 padding, 1 unknown word).

Every user with training rows is a client, in ascending id order (:mod:`hpcfl.data.clients`), and
its rows in the test files are its own test rows. Each file is parsed whole (the standard library's
``json``) and then converted user by user into one float32 block for the file, the Python objects
of a user dropped as soon as it is converted: at most one file's objects are held. The rows stay in
the order they were read (file by file; the clients' index arrays say where each user's are), so
the blocks are joined by copying each into the split's array and freeing it at once: the data is
held about once, not twice. A malformed file is a :class:`DataError` naming the file, the user and
the field.
"""

from __future__ import annotations

import json
import math
import mmap
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError
from .chars import LEAF_CHARS, UNKNOWN, CharCodec, vocab_problems
from .clients import listing, natural_groups, resolve
from .container import Dataset
from .disk import _open
from .tokens import encode, read_vocab

_F32_MAX = float(np.finfo(np.float32).max)
_LAYOUT = "LEAF's JSON: an object with users, num_samples and user_data ({id: {\"x\": [...], \"y\": [...]}})"


@dataclass(frozen=True)
class LeafOptions:
    train: str = field(default="train", metadata={
        "help": "LEAF's training split: a .json file or a folder of them (data/<name>/data/train); absolute or "
                "relative to data.root"})
    test: str = field(default="test", metadata={
        "help": "the test split, each user's own test rows: a .json file or a folder of them"})
    features: str = field(default="image", metadata={
        "choices": ("image", "chars", "tokens"),
        "help": "image: x rows are lists of numbers (FEMNIST); chars: x rows are strings, y the next character "
                "(Shakespeare); tokens: x rows are texts, y a class (Sent140)"})
    image_shape: tuple[int, ...] = field(default=(), metadata={
        "gt": 0, "help": "shape of one x row, e.g. [1, 28, 28] for FEMNIST; []: flat, as stored"})
    vocab: str = field(default=LEAF_CHARS, metadata={
        "help": "chars: the characters, id = position (default: LEAF's 80)"})
    unknown: str = field(default="error", metadata={
        "choices": UNKNOWN, "help": "chars: a character outside vocab is an error, or (map) id len(vocab)"})
    vocab_file: str = field(default="", metadata={
        "help": "tokens: the word list, one token per line (its first field: a GloVe .txt works), the k-th line "
                "id k + 2 (0: padding, 1: unknown word); absolute or relative to data.root"})
    seq_len: int = field(default=25, metadata={
        "gt": 0, "help": "tokens: words per row (LEAF's Sent140: 25): the first seq_len, then padding"})
    lowercase: bool = field(default=False, metadata={"help": "tokens: lower-case the text before the look-up"})
    num_classes: int = field(default=0, metadata={
        "ge": 0, "help": "number of classes; 0: image, tokens: the largest label + 1, chars: the vocabulary's ids"})

    def validate(self) -> list[str]:
        if self.features == "tokens" and not self.vocab_file:
            return ["features = 'tokens' needs vocab_file, the word list (one token per line, e.g. GloVe's .txt)"]
        return vocab_problems(self.vocab, "vocab") if self.features == "chars" else []


def parse(path: str) -> dict:
    """One JSON file as a dict; invalid JSON is a DataError with its line and column."""
    with _open(path, _LAYOUT) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}; "
                            f"expected {_LAYOUT}") from None
        except (UnicodeDecodeError, RecursionError) as e:
            raise DataError(f"{path} cannot be read as JSON ({type(e).__name__}: {e}); expected {_LAYOUT}") from None
    if not isinstance(doc, dict):
        raise DataError(f"{path}: the top level is a JSON {type(doc).__name__}; expected {_LAYOUT}")
    return doc


def layout(path: str, doc: dict) -> list[tuple[str, int]]:
    """(user, num_samples) pairs of a parsed file, after the checks that need no row read."""
    missing = [k for k in ("users", "num_samples", "user_data") if k not in doc]
    if missing:
        raise DataError(f"{path} lacks the key {', '.join(missing)} (has {', '.join(sorted(doc)) or 'none'}); "
                        f"expected {_LAYOUT}")
    users, counts, data = doc["users"], doc["num_samples"], doc["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or not isinstance(data, dict):
        raise DataError(f"{path}: users and num_samples must be lists and user_data an object; found "
                        f"{type(users).__name__}, {type(counts).__name__} and {type(data).__name__}")
    if len(users) != len(counts):
        raise DataError(f"{path}: users lists {len(users)} users but num_samples {len(counts)} counts; "
                        f"they must be in the same order, one count per user")
    seen = set()
    for i, (u, n) in enumerate(zip(users, counts)):
        if not isinstance(u, str):
            raise DataError(f"{path}: users[{i}] = {u!r} is not a string; user ids are strings (user_data's keys)")
        if u in seen:
            raise DataError(f"{path}: user {u!r} is listed twice in users (users[{i}])")
        seen.add(u)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise DataError(f"{path}: user {u!r}: num_samples[{i}] = {n!r} is not a row count (an integer >= 0)")
        if u not in data:
            raise DataError(f"{path}: user {u!r} is in users but not in user_data; every listed user needs "
                            f"its rows there")
    extra = [u for u in data if u not in seen]
    if extra:
        raise DataError(f"{path}: user {extra[0]!r} is in user_data but not in users ({len(extra)} such user(s)); "
                        f"list every user in users with its num_samples")
    return list(zip(users, counts))


class SplitReader:
    """One split's files, user by user, into numpy rows (x float32, y int64).

    ``width`` (image) or ``seq_len`` (chars) is the row length: from ``image_shape``, else from
    the first row read; every later row must have it (the training split's readers pass theirs
    on to the test split's).
    """

    def __init__(self, opts: LeafOptions, codec: CharCodec | None, width: int | None = None,
                 words: dict[str, int] | None = None):
        self.opts, self.codec, self.width, self.words = opts, codec, width, words
        self.blocks: list[tuple[np.ndarray, np.ndarray]] = []   # one (x, y) per file with rows, in read order
        self.ids: list[str] = []                                # every user, in read order
        self.starts: list[int] = []                             # its first row in the split
        self.sizes: list[int] = []
        self.where: dict[str, str] = {}
        self.total = 0

    def read(self, path: str) -> None:
        doc = parse(path)
        data = doc["user_data"] if isinstance(doc.get("user_data"), dict) else None
        users = layout(path, doc)
        rows_in_file = sum(n for _, n in users)
        bx = by = None
        at = 0
        for u, n in users:
            rows = data.pop(u)   # the user's Python objects go as soon as it is converted
            if u in self.where:
                raise DataError(f"{path}: user {u!r} is also in {self.where[u]}; a user's rows of one split "
                                f"belong in one file")
            if not isinstance(rows, dict) or "x" not in rows or "y" not in rows:
                has = ", ".join(sorted(rows)) if isinstance(rows, dict) else type(rows).__name__
                raise DataError(f"{path}: user_data[{u!r}] needs keys x and y (has {has or 'none'})")
            xs, ys = rows["x"], rows["y"]
            for key, val in (("x", xs), ("y", ys)):
                if not isinstance(val, list):
                    raise DataError(f"{path}: user_data[{u!r}][{key!r}] is a {type(val).__name__}; expected a list")
                if len(val) != n:
                    raise DataError(f"{path}: user {u!r}: num_samples says {n} rows but user_data[{u!r}][{key!r}] "
                                    f"has {len(val)}")
            name = f"{path}: user_data[{u!r}]"
            if self.words is not None:
                x, y = self._tokens(name, xs), labels(name, ys)
            elif self.codec is None:
                x, y = self._image(name, xs), labels(name, ys)
            else:
                x, y = self._chars(name, xs, ys)
            if n:
                if bx is None:   # the row length is known from the file's first user with rows
                    bx = _scratch((rows_in_file, *x.shape[1:]), np.float32)
                    by = _scratch((rows_in_file,), np.int64)
                bx[at:at + n], by[at:at + n] = x, y
            self.ids.append(u)
            self.starts.append(self.total + at)
            self.sizes.append(n)
            self.where[u] = path
            at += n
        if bx is not None:
            self.blocks.append((bx, by))
        self.total += rows_in_file

    def join(self, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
        """The split's x (rows, *shape) float32 and y (rows,) int64, in read order. Each file's block is
        freed as soon as it is copied, and the output's pages are touched only as they are written: the
        resident memory stays near one copy of the data."""
        x = np.empty((self.total, *shape), dtype=np.float32)
        y = np.empty(self.total, dtype=np.int64)
        at = 0
        while self.blocks:
            bx, by = self.blocks.pop(0)
            n = len(by)
            x[at:at + n] = bx.reshape(n, *shape)
            y[at:at + n] = by
            at += n
            del bx, by
        return x, y

    def _image(self, at: str, xs: list) -> np.ndarray:
        """(n, width) float32 from a list of n number lists."""
        if self.width is None and xs:
            first = xs[0]
            self.width = len(first) if isinstance(first, list) else 0
            if self.width == 0:
                raise DataError(f"{at}['x'][0] is {_short(first)}; expected a non-empty list of numbers (a flat row)")
        width = self.width or 0
        try:
            x = np.asarray(xs) if xs else np.zeros((0, width))
        except ValueError:   # ragged: the rows differ in length
            x = None
        if x is None or x.ndim != 2 or x.shape[1] != width or x.dtype.kind not in "iuf":
            raise DataError(_bad_row(at, xs, width))
        x = x.astype(np.float64, copy=False)
        bad = ~np.isfinite(x) | (np.abs(x) > _F32_MAX)
        if bad.any():
            r, c = (int(i) for i in np.argwhere(bad)[0])
            raise DataError(f"{at}['x'][{r}][{c}] = {float(x[r, c])!r} is not a finite float32 value; inputs must be "
                            f"finite: drop or fix that row")
        return x.astype(np.float32)

    def _tokens(self, at: str, xs: list) -> np.ndarray:
        """(n, seq_len) word ids as float32 from texts (or LEAF's Sent140 lists ending in the text)."""
        texts = []
        for r, row in enumerate(xs):
            text = row[-1] if isinstance(row, list) and row else row
            if not isinstance(text, str):
                raise DataError(f"{at}['x'][{r}] is {_short(row)}; expected a text, or a list whose last element "
                                f"is the text (LEAF's Sent140 rows)")
            texts.append(text)
        return encode(texts, self.words, self.opts.seq_len, self.opts.lowercase).astype(np.float32)

    def _chars(self, at: str, xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
        """(n, seq_len) ids as float32 and (n,) int64 label ids from strings."""
        n = len(xs)
        if self.width is None and xs:
            self.width = len(xs[0]) if isinstance(xs[0], str) else 0
            if self.width == 0:
                raise DataError(f"{at}['x'][0] is {_short(xs[0])}; expected a non-empty string of characters")
        seq = self.width or 0
        if not all(isinstance(s, str) for s in xs) or any(len(s) != seq for s in xs):
            r = next(i for i, s in enumerate(xs) if not isinstance(s, str) or len(s) != seq)
            raise DataError(f"{at}['x'][{r}] is {_short(xs[r])}; expected a string of {seq} characters "
                            f"(the first row's length)")
        if not all(isinstance(s, str) and len(s) == 1 for s in ys):
            r = next(i for i, s in enumerate(ys) if not isinstance(s, str) or len(s) != 1)
            raise DataError(f"{at}['y'][{r}] is {_short(ys[r])}; expected one character (the next one)")
        x = self._encode(at, "x", "".join(xs), seq)
        y = self._encode(at, "y", "".join(ys), 1)
        return x.reshape(n, seq).astype(np.float32), y

    def _encode(self, at: str, key: str, text: str, per_row: int) -> np.ndarray:
        ids, bad = self.codec.encode(text)
        if bad >= 0:
            r, c = divmod(bad, per_row)
            where = f"[{r}]" + (f", character {c}" if key == "x" else "")
            raise DataError(f"{at}[{key!r}]{where} is {text[bad]!r}, which is not in data.leaf.vocab ("
                            f"{len(self.codec.vocab)} characters); add it to vocab, or set data.leaf.unknown = "
                            f"'map' to give such characters one extra id")
        return ids


def _scratch(shape: tuple, dtype) -> np.ndarray:
    """An empty array in an anonymous memory map of its own, returned to the system the moment it is
    dropped (a block malloc gives may stay resident after it is freed: glibc serves blocks below its
    dynamic mmap threshold, which rises to the largest block freed, from the heap)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if size == 0:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, size), dtype=dtype).reshape(shape)


def labels(at: str, ys: list) -> np.ndarray:
    """(n,) int64 from a list of n integer labels (integral floats accepted), each >= 0."""
    try:
        y = np.asarray(ys) if ys else np.zeros(0, dtype=np.int64)
    except ValueError:
        y = None
    ok = y is not None and y.ndim == 1 and y.dtype.kind in "iuf"
    if ok and y.dtype.kind == "f":
        ok = bool(np.isfinite(y).all() and (np.mod(y, 1) == 0).all())
    if not ok:
        r = next((i for i, v in enumerate(ys) if isinstance(v, bool) or not isinstance(v, (int, float))
                  or not math.isfinite(v) or v != int(v)), 0)
        raise DataError(f"{at}['y'][{r}] is {_short(ys[r])}; expected an integer class label")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        r = int(np.argmin(y))
        raise DataError(f"{at}['y'][{r}] = {int(y[r])} is a negative label; labels are classes 0, 1, ...")
    return y


def _short(v) -> str:
    text = repr(v)
    return f"a {type(v).__name__}" if len(text) > 40 else f"{text} (a {type(v).__name__})"


def _bad_row(at: str, xs: list, width: int) -> str:
    """Why a user's x rows are no (n, width) number matrix: the first bad row (only on the error path)."""
    for r, row in enumerate(xs):
        if not isinstance(row, list):
            return f"{at}['x'][{r}] is {_short(row)}; expected a list of {width} numbers"
        if len(row) != width:
            return (f"{at}['x'][{r}] has {len(row)} values; expected {width} (data.leaf.image_shape, or the first "
                    f"row's length)")
        for c, v in enumerate(row):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return f"{at}['x'][{r}][{c}] is {_short(v)}; expected a number"
    return f"{at}['x'] is not a list of rows of {width} numbers"


def read_split(paths: list[str], opts: LeafOptions, codec, width, words=None) -> SplitReader:
    reader = SplitReader(opts, codec, width, words)
    for p in paths:
        reader.read(p)
    return reader


def load_leaf(opts: LeafOptions, root: str | None, seed: int) -> Dataset:
    """The LEAF dataset of ``opts.train`` and ``opts.test``: one client per training user."""
    what = "LEAF .json files (data/<name>/data/train or test)"
    train_files = listing(resolve(opts.train, root), (".json",), "data.leaf.train", what)
    test_files = listing(resolve(opts.test, root), (".json",), "data.leaf.test", what)
    codec = CharCodec(opts.vocab, opts.unknown) if opts.features == "chars" else None
    words = read_vocab(resolve(opts.vocab_file, root)) if opts.features == "tokens" else None
    width = int(np.prod(opts.image_shape)) if opts.image_shape and opts.features == "image" else None
    tr = read_split(train_files, opts, codec, width, words)
    te = read_split(test_files, opts, codec, tr.width, words)
    if tr.total == 0 or te.total == 0:
        split, files = ("data.leaf.train", train_files) if tr.total == 0 else ("data.leaf.test", test_files)
        raise DataError(f"{split}: no rows in {', '.join(files)}; expected LEAF files with users' rows")
    if codec is not None:
        shape = (tr.width,)
    elif words is not None:
        shape = (opts.seq_len,)
    else:
        shape = tuple(opts.image_shape) or (tr.width,)
    x_train, y_train = tr.join(shape)
    x_test, y_test = te.join(shape)
    clients, own_test, _ = natural_groups(tr.ids, tr.starts, tr.sizes, te.ids, te.starts, te.sizes)
    if codec is not None:
        needed, why = codec.size, f"the {codec.size} character ids"
    else:
        needed, why = int(max(y_train.max(), y_test.max())) + 1, f"labels up to {int(max(y_train.max(), y_test.max()))}"
    num_classes = opts.num_classes or needed
    if num_classes < needed:
        raise DataError(f"data.leaf.num_classes = {opts.num_classes} is too small for {why}; set it to at least "
                        f"{needed}, or 0 to have it found")
    return Dataset(name="leaf", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                   num_classes=num_classes, input_shape=shape, natural_clients=clients, natural_test=own_test)
