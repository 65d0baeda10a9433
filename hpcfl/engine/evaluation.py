"""Evaluation of the global model, split over ranks and reduced exactly (step 7 of the round loop)."""

from __future__ import annotations

import numpy as np
import torch

from ..client.trainer import evaluate_chunks
from ..parallel.comm import ExactSum


def evaluate(s, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor | None = None) -> tuple[float, float]:
    """(accuracy, mean loss) of the current model on (x, y), the same on every rank.

    ``index``: evaluate on ``x[index], y[index]`` without materialising them.

    A model whose outputs hold NaN or Inf on any chunk gives (NaN, inf): the loop then
    ends the run as diverged.

    Chunks of ``eval_batch_size`` samples are dealt to ranks round-robin; their counts
    and loss sums are reduced exactly, so the result does not depend on the rank count.
    """
    n = x.shape[0] if index is None else int(index.numel())
    bs = s.cfg.runtime.eval_batch_size
    chunks = [(lo, min(lo + bs, n)) for lo in range(0, n, bs)]
    acc = ExactSum(4)
    for row in evaluate_chunks(s.model, x, y, chunks[s.comm.rank :: s.comm.size], index):
        # A finite model can still overflow in its forward pass (a diverging run in float32):
        # such a chunk is counted, not summed, and every rank learns of it from the sum.
        acc.add(np.append(row, 0.0) if np.isfinite(row).all() else np.array([0.0, 0.0, 0.0, 1.0]))
    tot = acc.reduce(s.comm, total=len(chunks), root=None)
    if tot[3]:
        return float("nan"), float("inf")
    has_accuracy = getattr(s.model.module, "loss", None) is None
    return (tot[0] / tot[2] if has_accuracy else float("nan")), tot[1] / tot[2]


def train_eval_set(s) -> torch.Tensor:
    """Indices of the samples held by clients, for F(x) = sum_i p_i F_i(x) with p_i = n_i / n
    (an index, not a copy: the training set stays on the device once): every client's
    indices, already on the device, in sample order."""
    return torch.sort(s.client_index).values
