"""What the image datasets read from disk share (:mod:`hpcfl.data.cifar`, :mod:`hpcfl.data.idx`).

:class:`ImageNormOptions`: the per-channel normalisation, by default with each dataset's usual
mean and std. ``_image_dataset``: the labels checked against the number of classes and the uint8
images normalised to float32, as a :class:`Dataset`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..errors import DataError
from .augment import normalize_images
from .container import Dataset

_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "emnist": ((0.1751,), (0.3332,)),
}


@dataclass(frozen=True)
class ImageNormOptions:
    """``normalize``: ``standard`` (the dataset's usual mean/std), ``half`` (0.5, 0.5),
    ``none`` (pixels in [0, 1]); ``mean``/``std`` override per channel."""

    CHANNELS: ClassVar[int] = 1
    normalize: str = field(default="standard", metadata={
        "choices": ("standard", "half", "none"),
        "help": "standard: the dataset's usual per-channel mean/std; half: mean = std = 0.5; none: pixels in [0, 1]"})
    mean: tuple[float, ...] | None = field(default=None, metadata={
        "help": "per-channel mean, overrides normalize (set std too); unset: from normalize"})
    std: tuple[float, ...] | None = field(default=None, metadata={
        "gt": 0, "help": "per-channel std, overrides normalize (set mean too); unset: from normalize"})

    def validate(self) -> list[str]:
        out = []
        if (self.mean is None) != (self.std is None):
            out.append("set both mean and std, or neither")
        for key in ("mean", "std"):
            v = getattr(self, key)
            if v is not None and len(v) != self.CHANNELS:
                out.append(f"{key} needs {self.CHANNELS} value(s), one per channel; got {len(v)}")
        return out

    def stats(self, name: str):
        if self.mean is not None:
            return self.mean, self.std
        c = self.CHANNELS
        return {"standard": _STATS[name], "half": ((0.5,) * c, (0.5,) * c), "none": ((0.0,) * c, (1.0,) * c)}[
            self.normalize
        ]


def _image_dataset(name, opts, xtr, ytr, xte, yte, num_classes, augment, where) -> Dataset:
    for y, what in ((ytr, "training labels"), (yte, "test labels")):
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise DataError(f"{name} in {where}: {what} outside 0..{num_classes - 1} "
                            f"(found {int(y.min())}..{int(y.max())})")
    mean, std = opts.stats(name)
    return Dataset(
        name=name,
        x_train=normalize_images(xtr, mean, std),
        y_train=ytr.astype(np.int64),
        x_test=normalize_images(xte, mean, std),
        y_test=yte.astype(np.int64),
        num_classes=num_classes,
        input_shape=tuple(xtr.shape[1:]),
        augment=augment,
    )
