"""Partitions that give each client a chosen set of classes.

* ``label_k``: FedGSNR "Label 2" (cyclic over a class permutation) or FedLGA's P classes
  per device (random class slots, collisions repaired).
* ``shards``: McMahan's sort-by-label shards (FedLGA sanity script, GIFT "shards").
* ``biased_unbiased``: FedDisco NIID-2 (deterministic label-sorted shards).
* ``nonbalance`` and ``pareto``: FedGSNR's imbalanced partitions (paper Sec. 5 and App. D.1).

For label_k, nonbalance and pareto, each class's samples are split equally at random
among the clients that hold it (``split_class_among``); the draws follow the order of
the numpy reference used for the FedGSNR checks, so the same seed gives its partition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from .partition import class_indices, groups_from_owner, num_classes_of, require_nonempty


def split_class_among(labels, holders: list[list[int]], rng, k: int, num_classes: int):
    """Class c's indices, permuted, go to its holders in ``np.array_split`` chunks (in order)."""
    owner = np.full(len(labels), -1, dtype=np.int64)
    for c, idx in enumerate(class_indices(labels, num_classes)):
        h = holders[c]
        if not h:
            continue
        idx = rng.permutation(idx)
        m = len(h)
        sizes = np.full(m, len(idx) // m, dtype=np.int64)
        sizes[: len(idx) % m] += 1
        owner[idx] = np.repeat(np.asarray(h, dtype=np.int64), sizes)
    return groups_from_owner(owner, k)


def _holders_from_sets(class_sets, num_classes):
    holders = [[] for _ in range(num_classes)]
    for client, classes in enumerate(class_sets):
        for c in classes:
            holders[int(c)].append(client)
    return holders


def _check_k(value, name, num_classes):
    if value > num_classes:
        raise ConfigError(f"{name} = {value} exceeds the {num_classes} classes of the dataset; "
                          f"use at most {num_classes}")


_EMPTY_FIX = "a class has fewer samples than clients holding it; use fewer clients (data.num_clients)"


# -------------------------------------------------------------------------- label_k


@dataclass(frozen=True)
class LabelKOptions:
    classes_per_client: int = field(default=2, metadata={"gt": 0, "help": "distinct classes P held by every client"})
    assignment: str = field(default="cyclic", metadata={
        "choices": ("cyclic", "random"),
        "help": "cyclic: client k holds classes pi[(kP + j) mod C] (FedGSNR Label 2); random: shuffled class slots "
                "(FedLGA)"})


def _random_slots(k, p, c, rng, tries=100):
    """FedLGA: K*P class slots, every class (K*P)//C or one more times; shuffle into a K x P
    grid; repair rows with a repeated class by swapping with another row."""
    base = np.tile(np.arange(c), (k * p) // c)
    extra = rng.choice(c, size=(k * p) % c, replace=False)
    slots = np.concatenate([base, extra])
    for _ in range(tries):
        grid = rng.permutation(slots).reshape(k, p)
        for i in range(k):
            for a in range(p):
                v = grid[i, a]
                if np.count_nonzero(grid[i] == v) == 1:
                    continue
                for pos in rng.permutation(k * p):
                    j, b = divmod(int(pos), p)
                    w = grid[j, b]
                    if j != i and w not in grid[i] and v not in grid[j]:
                        grid[i, a], grid[j, b] = w, v
                        break
        if all(len(set(row.tolist())) == p for row in grid):
            return grid
    raise ConfigError(f"data.label_k: could not give {k} clients {p} distinct classes each; "
                      "use data.label_k.assignment = 'cyclic'")


def label_k(labels, num_clients, opts: LabelKOptions, seed, dataset=None):
    """Every client holds exactly ``classes_per_client`` (P) distinct classes.

    ``cyclic`` (FedGSNR Label 2): random class permutation pi; client k holds
    pi[(kP + j) mod C], j < P; every class has KP/C holders when C divides KP.
    ``random`` (FedLGA, Li et al.): random class slots, repaired so rows are distinct.
    Then each class is split equally at random among its holders.
    """
    k, p = num_clients, opts.classes_per_client
    c = num_classes_of(labels, dataset)
    _check_k(p, "data.label_k.classes_per_client", c)
    rng = np.random.default_rng(seed)
    if opts.assignment == "cyclic":
        perm = rng.permutation(c)
        sets = [[perm[(i * p + j) % c] for j in range(p)] for i in range(k)]
    else:
        sets = _random_slots(k, p, c, rng)
    parts = split_class_among(labels, _holders_from_sets(sets, c), rng, k, c)
    return require_nonempty(parts, "data.label_k", _EMPTY_FIX)


# --------------------------------------------------------------------------- shards


@dataclass(frozen=True)
class ShardsOptions:
    shards_per_client: int = field(default=2, metadata={"gt": 0, "help": "label-sorted shards P dealt to every client"})


def shards(labels, num_clients, opts: ShardsOptions, seed, dataset=None):
    """McMahan et al.: sort indices by label (stable), cut into K*P near-equal shards
    (``np.array_split``), deal P random shards to each client. A client may get fewer than
    P distinct classes (two shards of one class)."""
    n, k, p = len(labels), num_clients, opts.shards_per_client
    s = k * p
    if s > n:
        raise ConfigError(f"data.shards: {k} clients x {p} shards > {n} samples; lower "
                          "data.shards.shards_per_client or data.num_clients")
    order = np.argsort(labels, kind="stable")
    sizes = np.full(s, n // s, dtype=np.int64)
    sizes[: n % s] += 1
    perm = np.random.default_rng(seed).permutation(s)
    client_of_shard = np.empty(s, dtype=np.int64)
    client_of_shard[perm] = np.arange(s) // p
    owner = np.empty(n, dtype=np.int64)
    owner[order] = np.repeat(client_of_shard, sizes)
    return groups_from_owner(owner, k)


# ----------------------------------------------------------- biased_unbiased (NIID-2)


@dataclass(frozen=True)
class BiasedUnbiasedOptions:
    num_unbiased: int = field(default=1, metadata={
        "ge": 0, "help": "clients holding every class; the others are biased"})
    classes_per_client: int | None = field(default=None, metadata={
        "gt": 0, "help": "classes of every biased client, dividing the class count; unset: max(1, C // 5)"})
    shard: int | None = field(default=None, metadata={"gt": 0, "help": "samples per shard; unset: int(N / C / K)"})


def biased_unbiased(labels, num_clients, opts: BiasedUnbiasedOptions, seed, dataset=None):
    """FedDisco NIID-2: K - U biased clients with P classes each and U unbiased ones.

    shard = int(N / C / K) unless ``shard`` is given (a smaller shard fits datasets whose
    classes are not all the same size, e.g. sklearn digits); classes are taken in ascending index order (a stable sort by
    label). With G = C // P (5 for CIFAR-10 with P = 2 and CIFAR-100 with P = 20): biased
    client i holds classes (P i + j) mod C and takes G * shard samples of each, from offset
    shard * G * (i // G); unbiased client i takes shard samples of every class from offset
    shard * G * ceil(n_b / G) + shard * (i - n_b). FedDisco's code writes floor(n_b / G),
    the same whenever G divides n_b, which every paper setting has. No randomness: the seed
    is unused (the code's within-client shuffle does not change the sorted output).
    """
    n, k = len(labels), num_clients
    c = num_classes_of(labels, dataset)
    p = opts.classes_per_client if opts.classes_per_client is not None else max(1, c // 5)
    _check_k(p, "data.biased_unbiased.classes_per_client", c)
    if c % p:
        raise ConfigError(f"data.biased_unbiased.classes_per_client = {p} must divide the {c} classes")
    n_b = k - opts.num_unbiased
    if n_b < 0:
        raise ConfigError(f"data.biased_unbiased.num_unbiased = {opts.num_unbiased} exceeds "
                          f"data.num_clients = {k}")
    g = c // p
    shard = opts.shard if opts.shard is not None else int(n / c / k)
    if shard == 0:
        raise ConfigError(f"data.biased_unbiased: {n} samples, {c} classes and {k} clients leave "
                          "shards of 0 samples; use fewer clients")
    pools = class_indices(labels, c)
    owner = np.full(n, -1, dtype=np.int64)
    base_u = shard * g * (-(-n_b // g))

    def give(client, cls, lo, m):
        if lo + m > len(pools[cls]):
            raise ConfigError(f"data.biased_unbiased: class {cls} has {len(pools[cls])} samples, "
                              f"client {client} needs up to index {lo + m}; use fewer clients")
        owner[pools[cls][lo : lo + m]] = client

    for i in range(n_b):
        for j in range(p):
            give(i, (p * i + j) % c, shard * g * (i // g), g * shard)
    for i in range(n_b, k):
        for cls in range(c):
            give(i, cls, base_u + shard * (i - n_b), shard)
    return groups_from_owner(owner, k)


# ---------------------------------------------------------------- nonbalance, pareto


@dataclass(frozen=True)
class NonBalanceOptions:
    client_fractions: tuple[float, ...] = field(default=(0.1, 0.4, 0.5), metadata={
        "ge": 0, "le": 1, "help": "fractions of the clients that are abundant, medium, less (3 values summing to 1)"})
    class_fractions: tuple[float, ...] = field(default=(1.0, 0.5, 0.2), metadata={
        "gt": 0, "le": 1, "help": "fraction of the classes an abundant, medium, less client holds (3 values)"})
    abundant_first: bool = field(default=True, metadata={
        "help": "clients ordered abundant, medium, less (client 0 abundant); false: in random order"})

    def validate(self) -> list[str]:
        out = []
        if len(self.client_fractions) != 3 or abs(sum(self.client_fractions) - 1) > 1e-9:
            out.append("client_fractions needs 3 values (abundant, medium, less) summing to 1")
        if len(self.class_fractions) != 3:
            out.append("class_fractions needs 3 values (abundant, medium, less)")
        return out


def _classes_per_client(ncls, c, rng):
    return [rng.choice(c, size=int(m), replace=False) for m in ncls]


def nonbalance(labels, num_clients, opts: NonBalanceOptions, seed, dataset=None):
    """FedGSNR NonBalance: round(0.1K) abundant clients with all classes, round(0.4K)
    medium with round(0.5C), the rest with round(0.2C) (at least 1); each client's classes
    uniform without replacement; classes split equally at random among holders. Clients
    are ordered abundant, medium, less (client 0 abundant) unless ``abundant_first`` is
    false, when the class counts are permuted first (the numpy reference's default)."""
    k = num_clients
    c = num_classes_of(labels, dataset)
    rng = np.random.default_rng(seed)
    f_ab, f_med, _ = opts.client_fractions
    n_ab, n_med = int(round(f_ab * k)), int(round(f_med * k))
    if n_ab + n_med > k:
        n_med = k - n_ab
    sizes = [max(1, min(c, int(round(f * c)))) for f in opts.class_fractions]
    ncls = [sizes[0]] * n_ab + [sizes[1]] * n_med + [sizes[2]] * (k - n_ab - n_med)
    if not opts.abundant_first:
        ncls = list(rng.permutation(ncls))
    sets = _classes_per_client(ncls, c, rng)
    parts = split_class_among(labels, _holders_from_sets(sets, c), rng, k, c)
    return require_nonempty(parts, "data.nonbalance", _EMPTY_FIX)


@dataclass(frozen=True)
class ParetoOptions:
    shape: float = field(default=math.log(5) / math.log(4), metadata={
        "gt": 0, "help": "shape of x_i = 1 + Pareto(shape); the default log 5 / log 4 gives the 80/20 rule"})
    rounding: str = field(default="round", metadata={
        "choices": ("round", "ceil"),
        "help": "classes of client i from x_i / max x * C: round (half to even) or ceil"})


def pareto_class_counts(k, c, shape, rounding, rng) -> list[int]:
    x = 1 + rng.pareto(shape, size=k)
    xt = x / x.max()
    r = np.ceil(xt * c) if rounding == "ceil" else np.rint(xt * c)  # rint: half to even, as round()
    return [int(v) for v in np.clip(r, 1, c)]


def pareto(labels, num_clients, opts: ParetoOptions, seed, dataset=None):
    """FedGSNR Pareto ("80/20"): x_i = 1 + Pareto(shape), client i holds
    max(1, round(x_i / max x * C)) classes chosen uniformly; the largest x gets all C.
    Classes are split equally at random among holders. Very seed-dependent (see jobs/papers/fedgsnr_table1_pareto.toml)."""
    k = num_clients
    c = num_classes_of(labels, dataset)
    rng = np.random.default_rng(seed)
    ncls = pareto_class_counts(k, c, opts.shape, opts.rounding, rng)
    sets = _classes_per_client(ncls, c, rng)
    parts = split_class_among(labels, _holders_from_sets(sets, c), rng, k, c)
    return require_nonempty(parts, "data.pareto", _EMPTY_FIX)
