"""Partitions of a training set over clients: iid, Dirichlet family, quantity skew, natural.

Every partition is a pure function of ``(labels, num_clients, options, seed)`` (plus the
dataset for ``natural``). Randomness comes from one local ``np.random.default_rng(seed)``
(or, on request, a local legacy ``RandomState(seed)`` to replay old code bit for bit); the
global numpy generator is never touched. The result is a list of sorted int64 index arrays.

The hot paths are vectorised: work is per class, never per client or per sample.
The label-based recipes (label_k, shards, biased_unbiased, nonbalance, pareto) live in
:mod:`hpcfl.data.partition_labels`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError


# ------------------------------------------------------------------------ helpers


class Groups(Sequence):
    """A partition: per-client index arrays, sliced on demand from one concatenated array.

    ``flat`` (sum of sizes,) int64 holds every client's indices in id order and ``sizes``
    (clients,) their counts; ``groups[i]`` is a view of ``flat``, as ``np.split``'s pieces were.
    Nothing is built per client until asked for: a million clients cost no million small
    objects at start-up, and :func:`hpcfl.engine.simulation.prepare` reads ``flat`` directly.
    """

    def __init__(self, flat: np.ndarray, sizes: np.ndarray, ends: np.ndarray | None = None):
        self.flat, self.sizes = flat, sizes
        self._ends = np.cumsum(sizes) if ends is None else ends   # ends: cumsum(sizes), if already made

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]   # negative indices; IndexError past the end
        end = int(self._ends[i])
        return self.flat[end - int(self.sizes[i]) : end]

    def __iter__(self):
        ends = self._ends.tolist()
        return (self.flat[a:b] for a, b in zip([0] + ends[:-1], ends))


def groups_from_owner(owner: np.ndarray, num_clients: int) -> Groups:
    """Per-client sorted index arrays from ``owner[i]`` = client of sample i (-1: unused).

    Linear apart from one sort of n int64 keys (client + 1) * n + i, unique, so any sort is
    the stable one: 1M clients of 2 samples each take well under a second, where an argsort
    and ``np.split`` took 3.5 s. The pieces are views of one array (:class:`Groups`), as
    ``np.split``'s were.
    """
    owner = np.asarray(owner, dtype=np.int64)
    n = len(owner)
    counts = np.bincount(owner[owner >= 0], minlength=num_clients)
    if n and (num_clients + 1) * n < 2**62:
        key = (owner + 1) * n + np.arange(n, dtype=np.int64)
        key.sort()
        order = key % n
    else:   # keys would overflow: the stable argsort gives the same order
        order = np.argsort(owner, kind="stable")
    order = order[n - int(counts.sum()) :]  # drop the -1 block at the front
    return Groups(order, counts.astype(np.int64))


def num_classes_of(labels: np.ndarray, dataset) -> int:
    if dataset is not None:
        return int(dataset.num_classes)
    return int(labels.max()) + 1 if labels.size else 0


def class_indices(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """Ascending indices of each class (what ``np.where(y == c)[0]`` gives), in one pass."""
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=num_classes)[:num_classes]
    return np.split(order[: counts.sum()], np.cumsum(counts)[:-1])


def require_nonempty(parts: list[np.ndarray], where: str, why: str) -> list[np.ndarray]:
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError(
            f"{where}: {len(empty)} client(s) received no samples (first: client {empty[0]}); {why}"
        )
    return parts


def _split_counts(p: np.ndarray, n: int) -> np.ndarray:
    """Piece sizes of NIID-Bench's ``np.split(idx, (cumsum(p) * n).astype(int)[:-1])``."""
    cuts = (np.cumsum(p) * n).astype(np.int64)[:-1]
    cuts = np.clip(cuts, 0, n)
    return np.diff(np.concatenate(([0], cuts, [n])))


def _generator(seed: int, legacy: bool):
    return np.random.RandomState(seed) if legacy else np.random.default_rng(seed)


# ---------------------------------------------------------------------------- iid


@dataclass(frozen=True)
class IidOptions:
    drop_remainder: bool = field(default=False, metadata={
        "help": "every client gets exactly floor(N/K) samples (FedGSNR); false: the first N mod K clients get one "
                "more"})


def iid(labels, num_clients, opts: IidOptions, seed, dataset=None):
    """A uniformly random split into equal parts.

    ``drop_remainder`` gives every client exactly floor(N/K) samples (FedGSNR's "random
    equal split"); otherwise the first N mod K clients get one extra (``np.array_split``
    of a permutation, as NIID-Bench/FedDisco's ``homo``).
    """
    n, k = len(labels), num_clients
    perm = np.random.default_rng(seed).permutation(n)
    sizes = np.full(k, n // k, dtype=np.int64)
    if not opts.drop_remainder:
        sizes[: n % k] += 1
    owner = np.full(n, -1, dtype=np.int64)
    owner[perm[: sizes.sum()]] = np.repeat(np.arange(k), sizes)
    return groups_from_owner(owner, k)


# ---------------------------------------------------------- Dirichlet over clients


# The class-wise Dirichlet draw's options, shared by "dirichlet" and "longtail".
_ALPHA = {"gt": 0, "help": "Dirichlet concentration of each class's split over clients; smaller is more skewed"}
_MIN_SAMPLES = {"ge": 0, "help": "redraw the whole partition until every client has at least this many samples"}
_MAX_TRIES = {"gt": 0, "help": "most redraws before giving up with an error"}
_LEGACY_RNG = {"help": "draw with numpy's legacy RandomState (to replay FedNova's split) instead of default_rng"}


@dataclass(frozen=True)
class DirichletOptions:
    alpha: float = field(default=0.5, metadata=_ALPHA)
    min_samples: int = field(default=10, metadata=_MIN_SAMPLES)
    max_tries: int = field(default=1000, metadata=_MAX_TRIES)
    legacy_rng: bool = field(default=False, metadata=_LEGACY_RNG)
    fixed_seed: int | None = field(default=None, metadata={
        "help": "partition seed used instead of run.seed, one split for every run seed (2020 with legacy_rng replays "
                "FedNova); unset: run.seed"})


def _labeldir(labels, k, alpha, min_samples, max_tries, seed, legacy, num_classes, where, keep=None):
    """NIID-Bench ``noniid-labeldir`` (FedMA/FedNova/MOON/FedDisco), optionally long-tailed.

    Per class c (0..C-1, in order): shuffle the class's indices (keep the first keep[c]),
    draw p ~ Dir_K(alpha), zero p_j for clients already holding >= N/K samples (N = the
    whole training set), renormalise, cut at ``(cumsum(p) * n_c).astype(int)[:-1]``. The
    whole partition is redrawn until every client has >= min_samples, continuing the same
    generator. The final per-client shuffle of the original is omitted: the result is sorted.
    """
    n = len(labels)
    cap = n / k
    rng = _generator(seed, legacy)
    pools = class_indices(labels, num_classes)
    total = sum(len(p) if keep is None else min(len(p), keep[c]) for c, p in enumerate(pools))
    if min_samples * k > total:
        raise ConfigError(
            f"{where}.min_samples = {min_samples} is impossible: {k} clients x {min_samples} > "
            f"{total} samples; lower {where}.min_samples or data.num_clients"
        )
    clients = np.arange(k)
    smallest = 0
    for _ in range(max_tries):
        owner = np.full(n, -1, dtype=np.int64)
        sizes = np.zeros(k, dtype=np.int64)
        for c in range(num_classes):
            idx = pools[c].copy()
            rng.shuffle(idx)
            if keep is not None:
                idx = idx[: keep[c]]
            p = rng.dirichlet(np.repeat(alpha, k))
            open_ = sizes < cap
            p = p * open_
            s = p.sum()
            if not s > 0:  # every open client's share underflowed to 0 (tiny alpha): spread evenly
                p, s = open_.astype(np.float64), open_.sum()
            cnt = _split_counts(p / s, len(idx))
            owner[idx] = np.repeat(clients, cnt)
            sizes += cnt
        smallest = int(sizes.min())
        if smallest >= min_samples:
            return groups_from_owner(owner, k)
    raise ConfigError(
        f"{where}.min_samples = {min_samples} not reached in {max_tries} redraws ({k} clients, "
        f"{total} samples, alpha = {alpha}; the smallest client had {smallest}): lower "
        f"{where}.min_samples, raise {where}.alpha, use fewer clients (data.num_clients) or raise "
        f"{where}.max_tries"
    )


def dirichlet(labels, num_clients, opts: DirichletOptions, seed, dataset=None):
    """Class-wise Dirichlet split, NIID-Bench ``noniid-labeldir`` (workload W, FedNova's
    CIFAR-10 split, FedDisco NIID-1). ``fixed_seed``, when set, replaces the run seed, so the partition is
    the same for every run seed; ``legacy_rng = true, fixed_seed = 2020`` replays FedNova's
    ``__getDirichletData__`` (which seeds the global legacy generator with 2020)."""
    seed = seed if opts.fixed_seed is None else opts.fixed_seed
    return _labeldir(labels, num_clients, opts.alpha, opts.min_samples, opts.max_tries, seed,
                     opts.legacy_rng, num_classes_of(labels, dataset), "data.dirichlet")


@dataclass(frozen=True)
class LongtailOptions:
    rho: float = field(default=10.0, metadata={
        "ge": 1, "help": "imbalance ratio: class k keeps int(n_max * rho**(-k/(C-1))) samples; 1: balanced"})
    n_max: int | None = field(default=None, metadata={
        "gt": 0, "help": "samples kept of class 0; unset: the smallest class size"})
    alpha: float = field(default=0.5, metadata=_ALPHA)
    min_samples: int = field(default=10, metadata=_MIN_SAMPLES)
    max_tries: int = field(default=1000, metadata=_MAX_TRIES)
    legacy_rng: bool = field(default=False, metadata=_LEGACY_RNG)


def longtail_counts(rho: float, n_max: int, num_classes: int) -> list[int]:
    """FedDisco's exponential profile: class k (0-based) keeps int(n_max * rho**(-k/(C-1)))."""
    return [int(n_max * (rho ** (-k / (num_classes - 1)))) for k in range(num_classes)]


def longtail(labels, num_clients, opts: LongtailOptions, seed, dataset=None):
    """FedDisco's globally imbalanced training set split by NIID-1 (Ye et al. 2023).

    Inside every Dirichlet draw, class k keeps only the first ``longtail_counts`` of its
    shuffled indices. ``n_max`` (class 0's count) defaults to the smallest class size, which
    is the per-class count (5000 for CIFAR-10) on a balanced set; FedDisco's code uses
    N/num_clients, equal to that only with 10 clients. The N/K cap uses the full training
    set, as FedDisco's code. The test set is untouched (scenario 1); for scenario 2 see
    :func:`longtail_test_indices`.
    """
    c = num_classes_of(labels, dataset)
    if c < 2:
        raise ConfigError("data.longtail needs at least 2 classes")
    sizes = np.bincount(labels, minlength=c)[:c]
    n_max = opts.n_max if opts.n_max is not None else int(sizes.min())
    keep = longtail_counts(opts.rho, n_max, c)
    short = [i for i in range(c) if keep[i] > sizes[i]]
    if short:
        raise ConfigError(f"data.longtail.n_max = {n_max}: class {short[0]} has only {sizes[short[0]]} "
                          f"samples but would keep {keep[short[0]]}; lower data.longtail.n_max")
    return _labeldir(labels, num_clients, opts.alpha, opts.min_samples, opts.max_tries, seed,
                     opts.legacy_rng, c, "data.longtail", keep=keep)


def longtail_test_indices(y_test: np.ndarray, rho: float, num_classes: int) -> np.ndarray:
    """FedDisco scenario 2: class k keeps the first int(n_c * rho**(-k/(C-1))) of its test
    images (ascending index; n_c = len(y_test) // C). Returns sorted indices into the test set."""
    per = len(y_test) // num_classes
    pools = class_indices(np.asarray(y_test, dtype=np.int64), num_classes)
    keep = longtail_counts(rho, per, num_classes)
    return np.sort(np.concatenate([p[:m] for p, m in zip(pools, keep)])).astype(np.int64)


# ------------------------------------------------- Dirichlet per client (Hsu et al.)


@dataclass(frozen=True)
class DirichletClientOptions:
    alpha: float = field(default=0.5, metadata={
        "gt": 0, "help": "Dirichlet concentration of every client's label mix q_i ~ Dir(alpha 1_C); smaller is more "
                         "skewed"})


def dirichlet_client(labels, num_clients, opts: DirichletClientOptions, seed, dataset=None):
    """Hsu et al. (2019) per-client label mix (the Dirichlet partition of the FedGSNR and GIFT papers).

    Every client gets n = floor(N/K) samples. Client i (in order) draws q_i ~ Dir(alpha 1_C)
    (per-component alpha) and label counts ~ Multinomial(n, q_i); draws beyond what a class
    still has are redrawn from q_i restricted to the classes with samples left (uniform over
    them if q_i is zero there), until n are placed. That is the same law as FedGSNR's
    draw-one-class-at-a-time loop. Samples are taken without replacement from pre-shuffled
    class pools.
    """
    n, k = len(labels), num_clients
    c = num_classes_of(labels, dataset)
    rng = np.random.default_rng(seed)
    pools = [rng.permutation(p) for p in class_indices(labels, c)]
    left = np.array([len(p) for p in pools], dtype=np.int64)
    n_per = n // k
    take = np.zeros((k, c), dtype=np.int64)
    alphas = np.full(c, opts.alpha)
    for i in range(k):
        q = rng.dirichlet(alphas)
        got = np.zeros(c, dtype=np.int64)
        need = n_per
        while need > 0:
            room = left - got
            qq = q * (room > 0)
            s = qq.sum()
            if not s > 0:
                qq, s = (room > 0).astype(np.float64), (room > 0).sum()
            draw = np.minimum(rng.multinomial(need, qq / s), room)
            got += draw
            need -= int(draw.sum())
        take[i] = got
        left -= got
    owner = np.full(n, -1, dtype=np.int64)
    for j in range(c):  # clients took consecutive slices of each pool, in client order
        used = int(take[:, j].sum())
        owner[pools[j][:used]] = np.repeat(np.arange(k), take[:, j])
    return groups_from_owner(owner, k)


# -------------------------------------------------------------------- quantity skew


@dataclass(frozen=True)
class QuantitySkewOptions:
    alpha: float = field(default=0.5, metadata={
        "gt": 0, "help": "Dirichlet concentration of the client sizes p ~ Dir_K(alpha); smaller is more unequal"})
    min_samples: int = field(default=10, metadata={
        "ge": 0, "help": "redraw the sizes until every client has at least this many samples"})
    max_tries: int = field(default=1000, metadata={"gt": 0, "help": "most draws before giving up with an error"})


def quantity_skew(labels, num_clients, opts: QuantitySkewOptions, seed, dataset=None):
    """NIID-Bench ``iid-diff-quantity``: sizes ~ Dir_K(alpha) over an iid shuffle.

    Permute all indices; redraw p ~ Dir_K(alpha) until min(p * N) >= min_samples; cut the
    permutation at ``(cumsum(p) * N).astype(int)[:-1]`` (each size then is >= min_samples).
    """
    n, k = len(labels), num_clients
    if opts.min_samples * k > n:
        raise ConfigError(f"data.quantity_skew.min_samples = {opts.min_samples} is impossible for {k} clients "
                          f"and {n} samples; lower it or data.num_clients")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    best = 0.0
    for _ in range(opts.max_tries):
        p = rng.dirichlet(np.repeat(opts.alpha, k))
        p = p / p.sum()
        best = max(best, float(np.min(p * n)))
        if np.min(p * n) >= opts.min_samples:
            break
    else:
        raise ConfigError(
            f"data.quantity_skew.min_samples = {opts.min_samples} not reached in {opts.max_tries} draws "
            f"({k} clients, {n} samples, alpha = {opts.alpha}; the best smallest share was {best:.1f} "
            "samples): raise data.quantity_skew.alpha, lower data.quantity_skew.min_samples or "
            "data.num_clients"
        )
    owner = np.empty(n, dtype=np.int64)
    owner[perm] = np.repeat(np.arange(k), _split_counts(p, n))
    return groups_from_owner(owner, k)


# -------------------------------------------------------------------------- natural


@dataclass(frozen=True)
class NaturalOptions:
    pass


def natural(labels, num_clients, opts: NaturalOptions, seed, dataset=None):
    """The dataset's own clients (synthetic, leaf, tff, npz with ``client``); num_clients must
    match their number. A :class:`Groups` of natural clients (sorted pieces of one array) is
    returned as it is: 100k clients cost no 100k sorts."""
    nat = None if dataset is None else dataset.natural_clients
    if nat is None:
        name = "this dataset" if dataset is None else f"data.dataset = {dataset.name!r}"
        raise ConfigError(f"data.partition = 'natural' needs a dataset with built-in clients ('synthetic', "
                          f"'leaf', 'tff', or 'npz' with a client array); {name} has none: choose another "
                          f"data.partition")
    if num_clients != len(nat):
        raise ConfigError(f"data.num_clients = {num_clients}, but {dataset.name!r} has {len(nat)} natural "
                          f"clients; set data.num_clients = {len(nat)}")
    if isinstance(nat, Groups):
        return nat
    return [np.sort(np.asarray(a, dtype=np.int64)) for a in nat]
