"""Characters as class ids, for next-character prediction (LEAF's and TFF's Shakespeare).

A vocabulary is a string: character ``vocab[i]`` has id ``i``. The default is LEAF's 80 characters
(its ``language_utils``), so that a LEAF Shakespeare job gives the ids and classes of LEAF's model.
A character outside the vocabulary is either an error (``unknown = "error"``: the reader names the
file, user, row and character) or id ``len(vocab)``, one extra "unknown" class (``unknown = "map"``);
with "map" there are ``len(vocab) + 1`` ids, whether or not the data has an unknown character, so the
model's size does not depend on the data.

Ids are stored in float32 rows as the engine's inputs are (exact below 2**24); ``char_lstm`` casts
them back to integers (:mod:`hpcfl.models.rnn`).
"""

from __future__ import annotations

import numpy as np

# LEAF's Shakespeare vocabulary (models/utils/language_utils.py of github.com/TalwalkarLab/leaf): newline,
# space, 13 punctuation marks, the digits, ":;>?", the capitals, "[]", the small letters and "}".
LEAF_CHARS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
UNKNOWN = ("error", "map")


def vocab_problems(vocab: str, key: str) -> list[str]:
    """What makes ``vocab`` unusable (empty, a repeated character), for an options ``validate``."""
    if not vocab:
        return [f"{key} is empty; give the characters, id = position (default: LEAF's 80)"]
    seen: dict[str, int] = {}
    for i, c in enumerate(vocab):
        if c in seen:
            return [f"{key} repeats {c!r} (positions {seen[c]} and {i}); every character once"]
        seen[c] = i
    return []


def code_points(text: str) -> np.ndarray:
    """The code points of ``text``, uint32 (len(text),), in one C-level pass (lone surrogates kept)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


class CharCodec:
    """Text to ids over a vocabulary.

    Parameters
    ----------
    vocab : str
        Character ``vocab[i]`` has id ``i`` (checked by :func:`vocab_problems` beforehand).
    unknown : {"error", "map"}
        What a character outside ``vocab`` is: reported (:meth:`encode` gives its position) or
        id ``len(vocab)``.
    """

    def __init__(self, vocab: str, unknown: str = "error"):
        points = code_points(vocab)
        self.order = np.argsort(points, kind="stable")
        self.sorted = points[self.order]
        self.vocab, self.unknown = vocab, unknown
        self.size = len(vocab) + (unknown == "map")   # ids, and classes of next-character prediction

    def encode(self, text: str) -> tuple[np.ndarray, int]:
        """(ids int64 (len(text),), the position of the first character outside the vocabulary, or -1).

        With ``unknown = "map"`` such characters get id ``len(vocab)`` and the position is -1.
        """
        points = code_points(text)
        at = np.searchsorted(self.sorted, points)
        np.minimum(at, len(self.sorted) - 1, out=at)
        hit = self.sorted[at] == points
        ids = self.order[at].astype(np.int64)
        if hit.all():
            return ids, -1
        if self.unknown == "map":
            ids[~hit] = len(self.vocab)
            return ids, -1
        return ids, int(np.argmin(hit))


def windows(ids: np.ndarray, lengths: np.ndarray, seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Next-character examples from texts laid end to end.

    Parameters
    ----------
    ids : np.ndarray of int, shape (sum(lengths),)
        The texts' ids, one text after the other.
    lengths : np.ndarray of int, shape (T,)
        Each text's length.
    seq_len, stride : int
        A window is ``seq_len`` ids of one text and its label the id after them; windows start at
        0, stride, 2 stride, ... of each text, while the label is still inside it. A text of at
        most ``seq_len`` characters gives none.

    Returns
    -------
    x : np.ndarray of int64, shape (W, seq_len)
    y : np.ndarray of int64, shape (W,)
        In text order, then start order; no window crosses from one text into the next.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    count = np.where(lengths > seq_len, (lengths - seq_len - 1) // stride + 1, 0)
    offsets = np.cumsum(lengths) - lengths
    total = int(count.sum())
    first = np.cumsum(count) - count
    # window k of text t starts at offsets[t] + stride * (k - first[t])
    starts = np.repeat(offsets - stride * first, count) + stride * np.arange(total, dtype=np.int64)
    x = ids[starts[:, None] + np.arange(seq_len, dtype=np.int64)]
    return x, ids[starts + seq_len]
