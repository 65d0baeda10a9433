"""Words as ids, for text classification (LEAF's Sent140): a vocabulary file, LEAF's word split, padding.

* The vocabulary file has one token per line, its first whitespace-separated field (so GloVe's
  ``glove.6B.300d.txt``, which LEAF's Sent140 model uses, works as it is; blank lines are skipped).
  The token of the k-th line (from 0) has id ``k + 2``.
* Id 0 is padding and id 1 every word outside the vocabulary: a row of text becomes its first
  ``seq_len`` words' ids, followed by padding up to ``seq_len``.
* Words are split as LEAF's ``split_line`` does: runs of letters, digits, underscores and
  apostrophes, and each of ``. , ! ? ;`` on its own; everything else separates. No case folding:
  GloVe's tokens are lower case, so lower-case the text beforehand if yours is not
  (``lowercase = true`` in ``[data.leaf]`` does it as the rows are read).
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import DataError
from .disk import _open

PAD, OOV = 0, 1
_WORDS = re.compile(r"[\w']+|[.,!?;]")


def read_vocab(path: str) -> dict[str, int]:
    """{token: id} from a vocabulary file (ids from 2, in line order); a repeated token is a DataError."""
    what = "a vocabulary: one token per line (its first field; a GloVe .txt works)"
    vocab: dict[str, int] = {}
    with _open(path, what) as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}, line {number}: not UTF-8 text ({e.reason}); expected {what}") from None
            fields = line.split(maxsplit=1)
            if not fields:
                continue
            token = fields[0]
            if token in vocab:
                raise DataError(f"{path}, line {number}: token {token!r} is listed again (first as id {vocab[token]}); "
                                f"every token once")
            vocab[token] = len(vocab) + 2
    if not vocab:
        raise DataError(f"{path} holds no token; expected {what}")
    return vocab


def encode(texts: list[str], vocab: dict[str, int], seq_len: int, lowercase: bool) -> np.ndarray:
    """(len(texts), seq_len) int64: each text's first ``seq_len`` words' ids, then padding (0)."""
    out = np.zeros((len(texts), seq_len), dtype=np.int64)
    get = vocab.get
    for r, text in enumerate(texts):
        words = _WORDS.findall(text.lower() if lowercase else text)[:seq_len]
        out[r, :len(words)] = [get(w, OOV) for w in words]
    return out
