"""Evaluation of the global model, split over ranks and reduced exactly (step 7 of the round loop)."""

from __future__ import annotations

import numpy as np
import torch

from ..client.trainer import evaluate_chunks
from ..parallel.comm import ExactSum


class ClientEval:
    """Every client's held-out test rows (drawn: :func:`hpcfl.data.client_test.client_test_pairs`; a natural
    client's own: :func:`hpcfl.data.client_test.own_test_pairs`), arranged
    so that one chunk of the test set gives each client's sums over its rows in that chunk.

    ``sizes`` (N,) the rows per client; ``sample`` and ``client`` (pairs,) every (test row, client)
    pair, sorted by row, then client: a client's rows are then summed in ascending row order.
    """

    def __init__(self, sizes: np.ndarray, sample: np.ndarray, client: np.ndarray):
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.n = int(self.sizes.size)
        self.sample = np.asarray(sample, dtype=np.int64)     # (pairs,) ascending
        self.client = np.asarray(client, dtype=np.int64)     # (pairs,) its client

    def chunk_sums(self, lo: int, hi: int, hit: np.ndarray, loss: np.ndarray) -> np.ndarray:
        """(2N,) float64: each client's hits, then its summed loss, over its rows in ``[lo, hi)``.

        The same bits whichever rank evaluates the chunk (chunks are fixed by the test set):
        the exact sum over chunks then makes the totals independent of the rank count.
        """
        a, b = np.searchsorted(self.sample, (lo, hi))
        pos, who = self.sample[a:b] - lo, self.client[a:b]
        return np.concatenate([np.bincount(who, weights=hit[pos], minlength=self.n),
                               np.bincount(who, weights=loss[pos], minlength=self.n)])


def evaluate(s, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor | None = None,
             clients: ClientEval | None = None):
    """(accuracy, mean loss) of the current model on (x, y), the same on every rank.

    ``index``: evaluate on ``x[index], y[index]`` without materialising them.
    ``clients``: also each client's (accuracy, mean loss) on its held-out rows of (x, y), in
    the same pass; the result is then (accuracy, loss, client accuracies (N,), client losses
    (N,)), NaN for a client without rows.

    A model whose outputs hold NaN or Inf on any chunk gives (NaN, inf): the loop then
    ends the run as diverged.

    Chunks of ``eval_batch_size`` samples are dealt to ranks round-robin; their counts
    and loss sums are reduced exactly, so the result does not depend on the rank count.
    """
    n = x.shape[0] if index is None else int(index.numel())
    bs = s.cfg.runtime.eval_batch_size
    chunks = [(lo, min(lo + bs, n)) for lo in range(0, n, bs)]
    mine = chunks[s.comm.rank :: s.comm.size]
    extra = 0 if clients is None else 2 * clients.n
    samples = None if clients is None else []
    acc = ExactSum(4 + extra)
    for i, row in enumerate(evaluate_chunks(s.model, x, y, mine, index, samples)):
        # A finite model can still overflow in its forward pass (a diverging run in float32):
        # such a chunk is counted, not summed, and every rank learns of it from the sum.
        ok = bool(np.isfinite(row).all())
        out = np.zeros(4 + extra)
        out[:4] = np.append(row, 0.0) if ok else (0.0, 0.0, 0.0, 1.0)
        if clients is not None:
            hit, loss = samples[i]
            if ok and np.isfinite(loss).all():
                out[4:] = clients.chunk_sums(*mine[i], hit, loss)
            else:
                out[:4] = (0.0, 0.0, 0.0, 1.0)
        acc.add(out)
    tot = acc.reduce(s.comm, total=len(chunks), root=None)
    has_accuracy = getattr(s.model.module, "loss", None) is None
    if tot[3]:
        result = (float("nan"), float("inf"))
    else:
        result = ((tot[0] / tot[2] if has_accuracy else float("nan")), tot[1] / tot[2])
    if clients is None:
        return result
    with np.errstate(invalid="ignore", divide="ignore"):
        size = np.where(clients.sizes > 0, clients.sizes, np.nan)
        return (*result, tot[4 : 4 + clients.n] / size, tot[4 + clients.n :] / size)


def train_eval_set(s) -> torch.Tensor:
    """Indices of the samples held by clients, for F(x) = sum_i p_i F_i(x) with p_i = n_i / n
    (an index, not a copy: the training set stays on the device once): every client's
    indices, already on the device, in sample order."""
    return torch.sort(s.client_index).values
