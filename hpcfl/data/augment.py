"""Preprocessing: per-channel normalisation (numpy) and batch augmentation (torch).

:func:`augment_batch` is the CIFAR training augmentation of FedNova/FedDisco
(``RandomCrop(32, padding=4)`` then ``RandomHorizontalFlip()``), vectorised over the batch:
one gather builds every crop, with the flip folded into the column index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:  # torch is imported lazily: `hpcfl partition` need not pay for it
    import torch

_NORM_CHUNK = 2048


def normalize_images(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """uint8 images (N, C, H, W) -> float32 ``(x / 255 - mean[c]) / std[c]``.

    Works in chunks so no float64 copy of the whole set is ever made.
    """
    out = np.empty(x.shape, dtype=np.float32)
    m = np.asarray(mean, dtype=np.float32).reshape(1, -1, *([1] * (x.ndim - 2)))
    inv = (1.0 / np.asarray(std, dtype=np.float32)).reshape(m.shape)
    for lo in range(0, x.shape[0], _NORM_CHUNK):
        blk = out[lo : lo + _NORM_CHUNK]
        np.multiply(x[lo : lo + _NORM_CHUNK], np.float32(1.0 / 255.0), out=blk, dtype=np.float32)
        blk -= m
        blk *= inv
    return out


def padding_fill(mean: Sequence[float], std: Sequence[float]) -> tuple[float, ...]:
    """The ``fill`` that makes padding black, as torchvision pads before normalising."""
    return tuple(-m / s for m, s in zip(mean, std))


def augment_batch(
    x: "torch.Tensor",
    gen: "torch.Generator",
    pad: int = 4,
    flip: bool = True,
    fill: float | Sequence[float] = 0.0,
) -> "torch.Tensor":
    """Random crop with ``pad`` pixels of padding, then a horizontal flip with p = 0.5.

    Parameters
    ----------
    x : Tensor (B, C, H, W)
        A batch of (normalised) images; not modified.
    gen : torch.Generator
        The only source of randomness: the same generator state gives the same output.
        Draws, in order: B row offsets, B column offsets (each uniform in 0..2*pad), then
        B flip coins. The generator may live on any device; the draws are moved to x's.
    pad : int
        Padding on every side (4 for CIFAR).
    flip : bool
        Whether to apply the random horizontal flip.
    fill : float or per-channel sequence
        Value of the padded border, in the units of ``x``. torchvision pads black pixels
        *before* normalising; with normalised inputs that corresponds to ``-mean/std`` per
        channel (:func:`padding_fill`). The default 0 pads with the mean colour.

    Returns
    -------
    Tensor of the same shape, dtype and device as ``x``.
    """
    import torch

    if x.ndim != 4:
        raise ValueError(f"augment_batch expects (B, C, H, W), got shape {tuple(x.shape)}")
    b, c, h, w = x.shape
    dev = x.device
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=gen, device=gen.device).to(dev)
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=gen, device=gen.device).to(dev)
    if flip:
        coin = torch.rand(b, generator=gen, device=gen.device).to(dev) < 0.5
    else:
        coin = torch.zeros(b, dtype=torch.bool, device=dev)
    if pad > 0:
        padded = x.new_empty((b, c, h + 2 * pad, w + 2 * pad))
        fill_t = torch.as_tensor(fill, dtype=x.dtype, device=dev)
        padded[:] = fill_t.reshape(1, -1, 1, 1) if fill_t.ndim else fill_t
        padded[:, :, pad : pad + h, pad : pad + w] = x
    else:
        padded = x
    ar_h = torch.arange(h, device=dev)
    ar_w = torch.arange(w, device=dev)
    rows = oy[:, None] + ar_h  # (B, H)
    cols = ox[:, None] + torch.where(coin[:, None], (w - 1) - ar_w, ar_w)  # (B, W), flip folded in
    wp = w + 2 * pad
    flat = (rows[:, :, None] * wp + cols[:, None, :]).reshape(b, 1, h * w).expand(b, c, h * w)
    out = torch.gather(padded.reshape(b, c, -1), 2, flat)
    return out.reshape(b, c, h, w)
