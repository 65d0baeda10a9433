"""The dataset container and the datasets that need no files.

Every dataset here is a pure function of its options and the run seed:

* ``synthetic``: Synthetic(alpha, beta) of FedProx/LEAF (as in Wang et al. 2020, FedNova, Sec. 6), with natural clients.
* ``gaussian_mixture``: GMM-10, a 10-class Gaussian mixture for small-scale FedGSNR checks.
* ``digits``: scikit-learn's bundled 8x8 digits (no download).
* ``synthetic_images``: the CIFAR-shaped benchmark workload W (docs/workloads.md), bit-exact for seed 0.
* ``lga_synthetic``: the nonlinear 10-class data of the FedLGA sanity experiment (bench/fedlga_d3.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ConfigError, DataError


@dataclass(frozen=True)
class Dataset:
    """Train and test arrays, ready for the engine.

    ``x_*`` are float32 and already normalised; ``y_*`` are int64. When ``augment`` is
    true the engine applies :func:`hpcfl.data.augment.augment_batch` to every training
    batch. ``natural_clients`` holds per-client index arrays into the training set for
    datasets that come with their own clients (Synthetic).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    augment: bool = False
    natural_clients: tuple[np.ndarray, ...] | None = None


@dataclass(frozen=True)
class DatasetSpec:
    """Registry entry: option dataclass, loader ``load(options, root, seed)`` and a doc line.

    ``labels``, when set, is a cheaper loader with the same signature for previews: it
    returns the true training labels but placeholder inputs (see ``hpcfl.data.load_labels``).
    """

    options: type
    load: Callable[..., Dataset]
    doc: str
    labels: Callable[..., Dataset] | None = None
    cache: bool = False   # a pure function of (options, seed) worth caching on disk (hpcfl.data.cache)
    # ``files(options, root)``: problems with where the dataset's files should be (an unset or
    # missing data.root, a missing file), found without reading them, so that they are reported
    # with the job's other problems; None for a dataset that reads no files.
    files: Callable[..., list[str]] | None = None


@dataclass(frozen=True)
class NoOptions:
    """For components that take no options."""


# ---------------------------------------------------------------- synthetic (FedProx)


@dataclass(frozen=True)
class SyntheticOptions:
    alpha: float = field(default=1.0, metadata={
        "ge": 0, "help": "std of the clients' model means: how much the local models differ"})
    beta: float = field(default=1.0, metadata={
        "ge": 0, "help": "std of the clients' input-mean priors: how much the local inputs differ"})
    num_clients: int = field(default=30, metadata={
        "gt": 0, "le": 100000, "help": "natural clients generated (with partition = 'natural', set data.num_clients "
                                       "to it)"})
    iid: bool = field(default=False, metadata={
        "help": "one model and the same input means for every client (FedProx's synthetic_iid)"})


_SYN_DIM = 60
_SYN_CLASSES = 10


def load_synthetic(opts: SyntheticOptions, root: str | None, seed: int) -> Dataset:
    """Synthetic(alpha, beta) exactly as FedProx's ``generate_synthetic.py``.

    The draws are made in FedProx's order with a local legacy ``RandomState(seed)`` (the
    original used the global legacy generator). The original shuffled each client with
    Python's unseeded ``random.shuffle``; here the same ``RandomState`` permutes each client
    after generation. Each client is split 90/10 (``int(0.9 n)`` train); the test set is
    the union of the client test parts.
    """
    rs = np.random.RandomState(seed)
    k = opts.num_clients
    sizes = rs.lognormal(4, 2, k).astype(int) + 50
    mean_w = rs.normal(0, opts.alpha, k)
    mean_b = mean_w
    b_prior = rs.normal(0, opts.beta, k)
    diagonal = np.power(np.arange(1, _SYN_DIM + 1, dtype=np.float64), -1.2)
    cov_x = np.diag(diagonal)
    _, sv, vh = np.linalg.svd(cov_x)
    factor = np.sqrt(sv)[:, None] * vh
    mean_x = np.zeros((k, _SYN_DIM))
    for i in range(k):
        if opts.iid:
            mean_x[i] = np.ones(_SYN_DIM) * b_prior[i]
        else:
            mean_x[i] = rs.normal(b_prior[i], 1, _SYN_DIM)
    if opts.iid:
        w_global = rs.normal(0, 1, (_SYN_DIM, _SYN_CLASSES))
        b_global = rs.normal(0, 1, _SYN_CLASSES)
    xs, ys = [], []
    for i in range(k):
        w = rs.normal(mean_w[i], 1, (_SYN_DIM, _SYN_CLASSES))
        b = rs.normal(mean_b[i], 1, _SYN_CLASSES)
        if opts.iid:
            w, b = w_global, b_global
        # rs.multivariate_normal(mean_x[i], cov_x, sizes[i]) with its SVD factor computed once:
        # the same draws and operations (numpy's legacy implementation), bitwise the same samples
        xx = np.dot(rs.standard_normal((sizes[i], _SYN_DIM)), factor)
        xx += mean_x[i]
        yy = np.argmax(xx @ w + b, axis=1)  # argmax(softmax(z)) == argmax(z)
        xs.append(xx)
        ys.append(yy)
    xtr, ytr, xte, yte, clients = [], [], [], [], []
    offset = 0
    for i in range(k):
        perm = rs.permutation(sizes[i])
        n_tr = int(0.9 * sizes[i])
        xtr.append(xs[i][perm[:n_tr]])
        ytr.append(ys[i][perm[:n_tr]])
        xte.append(xs[i][perm[n_tr:]])
        yte.append(ys[i][perm[n_tr:]])
        clients.append(np.arange(offset, offset + n_tr, dtype=np.int64))
        offset += n_tr
    return Dataset(
        name="synthetic",
        x_train=np.concatenate(xtr).astype(np.float32),
        y_train=np.concatenate(ytr).astype(np.int64),
        x_test=np.concatenate(xte).astype(np.float32),
        y_test=np.concatenate(yte).astype(np.int64),
        num_classes=_SYN_CLASSES,
        input_shape=(_SYN_DIM,),
        natural_clients=tuple(clients),
    )


# ---------------------------------------------------------------- GMM-10 (FedGSNR checks)


@dataclass(frozen=True)
class GaussianMixtureOptions:
    num_train: int = field(default=20000, metadata={"gt": 0, "help": "training samples"})
    num_test: int = field(default=5000, metadata={"gt": 0, "help": "test samples"})
    num_classes: int = field(default=10, metadata={"ge": 2, "help": "number of classes"})
    dim: int = field(default=20, metadata={"gt": 0, "help": "input dimension"})
    modes: int = field(default=6, metadata={"gt": 0, "help": "Gaussian modes per class"})
    sep: float = field(default=0.8, metadata={
        "ge": 0, "help": "std of the mode centres, N(0, sep^2 I): larger separates the classes more"})
    noise: float = field(default=1.0, metadata={
        "ge": 0, "help": "std of the Gaussian noise around a sample's mode centre"})
    seed_offset: int = field(default=0, metadata={
        "help": "drawn from default_rng(run.seed + seed_offset): another offset, another data set"})


def load_gaussian_mixture(opts: GaussianMixtureOptions, root: str | None, seed: int) -> Dataset:
    """GMM-10, the mixture of the FedGSNR checks, drawn from ``default_rng(seed + seed_offset)``.

    Mode centres ~ N(0, sep^2 I) with shape (classes, modes, dim); a sample is
    centre[y, mode] + noise * N(0, I), y and mode uniform; train is drawn before test.
    """
    rng = np.random.default_rng(seed + opts.seed_offset)
    c, m, d = opts.num_classes, opts.modes, opts.dim
    centers = rng.normal(0, opts.sep, size=(c, m, d))

    def gen(n):
        y = rng.integers(0, c, size=n)
        mode = rng.integers(0, m, size=n)
        return centers[y, mode] + opts.noise * rng.normal(size=(n, d)), y

    (xtr, ytr), (xte, yte) = gen(opts.num_train), gen(opts.num_test)
    return Dataset(
        name="gaussian_mixture",
        x_train=xtr.astype(np.float32),
        y_train=ytr.astype(np.int64),
        x_test=xte.astype(np.float32),
        y_test=yte.astype(np.int64),
        num_classes=c,
        input_shape=(d,),
    )


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


# ---------------------------------------------------------------- FedLGA sanity data


@dataclass(frozen=True)
class LgaSyntheticOptions:
    num_train: int = field(default=4000, metadata={"gt": 0, "help": "training samples"})
    num_test: int = field(default=2000, metadata={"gt": 0, "help": "test samples"})
    dim: int = field(default=32, metadata={"gt": 0, "help": "input dimension d"})
    num_classes: int = field(default=10, metadata={"ge": 2, "help": "number of classes C"})
    noise: float = field(default=1.2, metadata={
        "ge": 0, "help": "std of the Gaussian noise around a sample's class mean, before the nonlinear map"})
    seed_offset: int = field(default=1000, metadata={
        "help": "drawn from default_rng(run.seed + seed_offset); 1000 is the FedLGA sanity experiment's "
                "default_rng(1000 + seed)"})


def load_lga_synthetic(opts: LgaSyntheticOptions, root: str | None, seed: int) -> Dataset:
    """The synthetic data of FedLGA's sanity experiment, drawn from ``default_rng(seed + seed_offset)``.

    In order from that one generator: class means mu ~ N(0, 1) (C, d), a mixing matrix
    W ~ N(0, 1) / sqrt(d) (d, d), then the training set, then the test set, each as
    y ~ U{0..C-1}, z = mu[y] + noise * N(0, I), x = tanh(z W) + 0.1 z. Computed in float64 and
    stored as float32, so the class structure is nonlinear but the labels stay recoverable.
    """
    rng = np.random.default_rng(seed + opts.seed_offset)
    c, d = opts.num_classes, opts.dim
    means = rng.normal(0, 1.0, (c, d))
    mix = rng.normal(0, 1.0, (d, d)) / np.sqrt(d)

    def gen(n):
        y = rng.integers(0, c, n)
        z = means[y] + rng.normal(0, opts.noise, (n, d))
        return (np.tanh(z @ mix) + 0.1 * z).astype(np.float32), y.astype(np.int64)

    (xtr, ytr), (xte, yte) = gen(opts.num_train), gen(opts.num_test)
    return Dataset(name="lga_synthetic", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte, num_classes=c,
                   input_shape=(d,))


_F32_MAX = float(np.finfo(np.float32).max)
_ROWS = 4096   # rows checked at a time: the finite-value check never holds a mask as large as x


def check_arrays(name: str, x: np.ndarray, y: np.ndarray, what: str) -> None:
    """Raise DataError unless x is an array of numeric samples (at least 1-D rows: shape (n, ...)),
    with one row per label, every value finite and within float32's range (the engine trains in
    float32 or float64 from a float32 copy), and labels are non-negative.

    ``what`` names the pair, e.g. ``"x/y"``; its first name is the inputs' array. A NaN or Inf
    input would reach the model and surface rounds later as "diverged" (NaN) or as every client's
    update refused by the guard (Inf), blaming the learning rate or the clients: the message here
    names the file, the array, the first bad index and the fix instead.
    """
    xname = what.split("/")[0]
    if x.ndim < 2:
        raise DataError(f"{name}: {xname} has shape {x.shape}; expected one row per sample, shape (samples, "
                        f"features...) with at least 2 dimensions (e.g. reshape a 1-D feature to (n, 1))")
    if x.dtype.kind not in "biuf":
        raise DataError(f"{name}: {xname} has dtype {x.dtype}; expected numbers (bool, integer or float)")
    if x.dtype.kind == "f":
        for start in range(0, x.shape[0], _ROWS):
            block = x[start:start + _ROWS]
            bad = ~np.isfinite(block) | (np.abs(block) > _F32_MAX)
            if bad.any():
                at = tuple(int(i) for i in np.argwhere(bad)[0])
                at = (at[0] + start,) + at[1:]
                value = float(x[at])
                why = "not finite" if not np.isfinite(value) else "beyond float32's range (it would become inf)"
                raise DataError(f"{name}: {xname}[{', '.join(map(str, at))}] = {value!r} is {why}; "
                                f"inputs must be finite: replace or drop those samples (e.g. np.nan_to_num, or "
                                f"keep np.isfinite(x).all(axis=...) rows) and write the file again")
    if x.shape[0] != y.shape[0]:
        raise DataError(f"{name}: {what} has {x.shape[0]} inputs but {y.shape[0]} labels")
    if y.size and y.min() < 0:
        raise DataError(f"{name}: {what} has a negative label ({int(y.min())})")


EMBEDDED = {
    "synthetic": DatasetSpec(
        SyntheticOptions, load_synthetic, "Synthetic(alpha, beta) of FedProx/LEAF, 60 features, natural clients",
        cache=True,
    ),
    "gaussian_mixture": DatasetSpec(
        GaussianMixtureOptions, load_gaussian_mixture, "GMM-10 of FedGSNR: 10 classes x 6 modes in 20 dimensions",
        cache=True,
    ),
    "digits": DatasetSpec(DigitsOptions, load_digits_dataset, "scikit-learn 8x8 digits, 1797 images, no download"),
    "synthetic_images": DatasetSpec(
        SyntheticImagesOptions, load_synthetic_images, "CIFAR-shaped class-mean images plus noise (bench W)",
        load_synthetic_images_labels, cache=True,
    ),
    "lga_synthetic": DatasetSpec(
        LgaSyntheticOptions, load_lga_synthetic, "FedLGA sanity data: 10 classes, tanh-mixed 32-d Gaussians",
        cache=True,
    ),
}

