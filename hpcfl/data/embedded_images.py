"""The image-shaped datasets that need no files (registered in ``hpcfl.data.datasets.EMBEDDED``).

Each is a pure function of its options and the run seed:

* ``digits``: scikit-learn's bundled 8x8 digits (no download).
* ``synthetic_images``: the CIFAR-shaped benchmark workload W (docs/workloads.md), bit-exact for seed 0;
  its labels-only loader for previews draws no noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from .container import Dataset

# ---------------------------------------------------------------- sklearn digits


@dataclass(frozen=True)
class DigitsOptions:
    test_fraction: float = field(default=0.25, metadata={
        "gt": 0, "lt": 1, "help": "fraction of every class held out as the (seeded, stratified) test set"})
    test_per_class: int | None = field(default=None, metadata={
        "gt": 0, "help": "hold out exactly this many images of every class instead; unset: use test_fraction"})
    normalize: bool = field(default=True, metadata={
        "help": "standardise with the training split's mean and std; false: pixels in [0, 1]"})


def load_digits_dataset(opts: DigitsOptions, root: str | None, seed: int) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 images), pixels scaled by 1/16 to [0, 1].

    The test split is stratified and seeded: ``test_fraction`` of every class, or exactly
    ``test_per_class`` images of every class when that is set (the FedDisco digits check holds out 50).
    With ``normalize`` the single channel is standardised with the training split's mean and std.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data.astype(np.float64) / 16.0).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    test = []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        if opts.test_per_class is not None:
            n_te = opts.test_per_class
        else:
            n_te = int(round(opts.test_fraction * len(idx)))
        if not 0 < n_te < len(idx):
            raise ConfigError(
                f"data.digits: class {c} has {len(idx)} images, cannot hold out {n_te}; "
                "lower data.digits.test_per_class or data.digits.test_fraction"
            )
        test.append(idx[:n_te])
    is_test = np.zeros(len(y), dtype=bool)
    is_test[np.concatenate(test)] = True
    xtr, xte = x[~is_test], x[is_test]
    if opts.normalize:
        mean, std = xtr.mean(), xtr.std()
        xtr, xte = (xtr - mean) / std, (xte - mean) / std
    return Dataset(
        name="digits",
        x_train=xtr.astype(np.float32),
        y_train=y[~is_test],
        x_test=xte.astype(np.float32),
        y_test=y[is_test],
        num_classes=10,
        input_shape=(1, 8, 8),
    )


# ---------------------------------------------------------------- CIFAR-shaped (workload W)


@dataclass(frozen=True)
class SyntheticImagesOptions:
    num_train: int = field(default=50000, metadata={"gt": 0, "help": "training images"})
    num_test: int = field(default=10000, metadata={"gt": 0, "help": "test images"})
    num_classes: int = field(default=10, metadata={"ge": 2, "help": "number of classes"})
    image_shape: tuple[int, ...] = field(default=(3, 32, 32), metadata={
        "gt": 0, "help": "shape of one image, (C, H, W)"})
    mean_scale: float = field(default=1.5, metadata={
        "ge": 0, "help": "scale of the class mean images against unit-std noise: larger is easier"})
    seed_offset: int = field(default=0, metadata={
        "help": "drawn from default_rng(run.seed + seed_offset); 0 with seed 0 is workload W exactly"})
    augment: bool = field(default=False, metadata={
        "help": "random crop (4-pixel padding) and horizontal flip of every training batch"})


_CHUNK = 4096  # rows of noise drawn at a time; the stream is identical to one big draw


def _class_images(rng, means, n, num_classes, scale):
    y = rng.integers(0, num_classes, size=n)
    x = means[y]
    x *= scale
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        x[lo:hi] += rng.standard_normal((hi - lo, *means.shape[1:]), dtype=np.float32)
    return x, y.astype(np.int64)


def load_synthetic_images(opts: SyntheticImagesOptions, root: str | None, seed: int) -> Dataset:
    """Workload W (docs/workloads.md): class mean images plus unit Gaussian noise.

    One ``default_rng(seed + seed_offset)`` draws, in order: the means (classes, *shape),
    train labels, train noise, test labels, test noise. With the defaults and seed 0 the
    arrays are bit-identical to W's definition (tests check its SHA-256 prefixes). The noise is
    drawn in chunks to bound memory; numpy's stream makes that identical to one draw.
    """
    rng = np.random.default_rng(seed + opts.seed_offset)
    shape = tuple(opts.image_shape)
    means = rng.standard_normal((opts.num_classes, *shape), dtype=np.float32)
    scale = np.float32(opts.mean_scale)
    xtr, ytr = _class_images(rng, means, opts.num_train, opts.num_classes, scale)
    xte, yte = _class_images(rng, means, opts.num_test, opts.num_classes, scale)
    return Dataset(
        name="synthetic_images",
        x_train=xtr,
        y_train=ytr,
        x_test=xte,
        y_test=yte,
        num_classes=opts.num_classes,
        input_shape=shape,
        augment=opts.augment,
    )


def load_synthetic_images_labels(opts: SyntheticImagesOptions, root: str | None, seed: int) -> Dataset:
    """Training labels of :func:`load_synthetic_images` without drawing any noise.

    The labels are the second draw, right after the means, so they are exact. Inputs are
    zero-stride placeholders and the test split is empty (its labels follow the train noise).
    """
    rng = np.random.default_rng(seed + opts.seed_offset)
    shape = tuple(opts.image_shape)
    rng.standard_normal((opts.num_classes, *shape), dtype=np.float32)
    y = rng.integers(0, opts.num_classes, size=opts.num_train).astype(np.int64)
    return Dataset(
        name="synthetic_images",
        x_train=np.broadcast_to(np.float32(0), (opts.num_train, *shape)),
        y_train=y,
        x_test=np.broadcast_to(np.float32(0), (0, *shape)),
        y_test=np.zeros(0, dtype=np.int64),
        num_classes=opts.num_classes,
        input_shape=shape,
        augment=opts.augment,
    )
