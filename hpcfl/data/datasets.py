"""The tabular datasets that need no files, and EMBEDDED, the registry of all datasets that need none.

Every dataset here is a pure function of its options and the run seed:

* ``synthetic``: Synthetic(alpha, beta) of FedProx/LEAF (as in Wang et al. 2020, FedNova, Sec. 6), with natural clients.
* ``gaussian_mixture``: GMM-10, a 10-class Gaussian mixture for small-scale FedGSNR checks.
* ``lga_synthetic``: the nonlinear 10-class data of the FedLGA sanity experiment (bench/fedlga_d3.py).

The image-shaped ones, ``digits`` and ``synthetic_images``, are in :mod:`hpcfl.data.embedded_images`;
the container they all return, :class:`Dataset`, and :class:`DatasetSpec` in :mod:`hpcfl.data.container`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .container import Dataset, DatasetSpec
from .embedded_images import (
    DigitsOptions,
    SyntheticImagesOptions,
    load_digits_dataset,
    load_synthetic_images,
    load_synthetic_images_labels,
)

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

