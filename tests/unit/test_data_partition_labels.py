"""Label-based partitions: label_k, shards, biased_unbiased (NIID-2), nonbalance, pareto."""

import math
from collections import Counter

import numpy as np
import pytest

from hpcfl.data import class_counts, make_partition
from hpcfl.data.partition_labels import (
    BiasedUnbiasedOptions, LabelKOptions, NonBalanceOptions, ParetoOptions, ShardsOptions,
    pareto_class_counts,
)
from hpcfl.errors import ConfigError


def balanced(per_class, classes=10, seed=0):
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))


def disjoint(parts):
    allidx = np.concatenate(parts)
    return len(np.unique(allidx)) == len(allidx)


# --------------------------------------------------------------------------- label_k


def test_label2_cyclic_fedgsnr():
    y = balanced(600)
    parts = make_partition("label_k", y, 30, LabelKOptions(classes_per_client=2), 0)
    counts = class_counts(y, parts, 10)
    assert disjoint(parts) and counts.sum() == 6000
    assert set((counts > 0).sum(1)) == {2}  # every client exactly 2 classes
    assert set((counts > 0).sum(0)) == {6}  # every class 2K/C = 6 holders
    assert set(counts[counts > 0]) == {100}  # each class split equally among its holders


@pytest.mark.parametrize("classes,per_class,p,size", [(10, 6000, 2, 1200), (100, 500, 20, 1000)])
def test_label_k_random_slots_fedlga(classes, per_class, p, size):
    # FMNIST N=50, P=2 -> 1200 each; CIFAR-100 N=50, P=20 -> 1000 each (FedLGA, Li et al.)
    y = balanced(per_class, classes)
    parts = make_partition("label_k", y, 50, LabelKOptions(p, "random"), 1, None)
    counts = class_counts(y, parts, classes)
    assert disjoint(parts) and counts.sum() == len(y)  # union is the whole train set
    assert set((counts > 0).sum(1)) == {p}
    assert {len(q) for q in parts} == {size}


def test_label_k_too_many_classes():
    with pytest.raises(ConfigError, match=r"data\.label_k\.classes_per_client = 11 exceeds the 10"):
        make_partition("label_k", balanced(10), 5, LabelKOptions(11), 0)


# ---------------------------------------------------------------------------- shards


def test_shards_mcmahan():
    y = balanced(100)
    parts = make_partition("shards", y, 20, ShardsOptions(2), 0)
    counts = class_counts(y, parts, 10)
    assert disjoint(parts) and counts.sum() == 1000
    assert {len(p) for p in parts} == {50}
    assert (counts > 0).sum(1).max() <= 2
    # shards are label-sorted runs: 40 shards of 25, each within one class
    assert set(counts[counts > 0]) <= {25, 50}


# ------------------------------------------------------------------- NIID-2 (FedDisco)


def test_niid2_six_clients_exact():
    y = balanced(5000)
    parts = make_partition("biased_unbiased", y, 6, BiasedUnbiasedOptions(num_unbiased=1), 0)
    counts = class_counts(y, parts, 10)
    assert disjoint(parts)
    assert [len(p) for p in parts] == [8330] * 6
    for i in range(5):
        expect = np.zeros(10, int)
        expect[[2 * i, 2 * i + 1]] = 4165
        assert counts[i].tolist() == expect.tolist()
    assert counts[5].tolist() == [833] * 10
    assert len(y) - counts.sum() == 20
    # deterministic: classes are taken in ascending index order, independent of the seed
    other = make_partition("biased_unbiased", y, 6, BiasedUnbiasedOptions(num_unbiased=1), 99)
    assert all(np.array_equal(p, q) for p, q in zip(parts, other))
    first = np.flatnonzero(y == 0)[:4165]
    assert np.array_equal(parts[0][y[parts[0]] == 0], first)


@pytest.mark.parametrize("k,u,size", [(60, 10, 830), (50, 10, 1000)])
def test_niid2_partial_participation_variants(k, u, size):
    y = balanced(5000)
    parts = make_partition("biased_unbiased", y, k, BiasedUnbiasedOptions(num_unbiased=u), 0)
    counts = class_counts(y, parts, 10)
    assert disjoint(parts)
    assert {len(p) for p in parts} == {size}
    assert set((counts[: k - u] > 0).sum(1)) == {2}
    assert set((counts[k - u :] > 0).sum(1)) == {10}


def test_niid2_cifar100_classes():
    y = balanced(500, 100)
    parts = make_partition("biased_unbiased", y, 6, BiasedUnbiasedOptions(), 0)
    counts = class_counts(y, parts, 100)
    assert disjoint(parts)
    for i in range(5):
        assert set(np.flatnonzero(counts[i])) == {(20 * i + j) % 100 for j in range(20)}
    assert (counts[5] > 0).all()


# ------------------------------------------------------------------------ nonbalance


@pytest.mark.parametrize("k,groups", [(30, (3, 12, 15)), (100, (10, 40, 50))])
def test_nonbalance_groups(k, groups):
    y = balanced(1000)
    parts = make_partition("nonbalance", y, k, NonBalanceOptions(), 0)
    ncls = (class_counts(y, parts, 10) > 0).sum(1)
    assert disjoint(parts)
    a, m, _ = groups
    assert ncls[:a].tolist() == [10] * a  # abundant first, client 0 abundant
    assert ncls[a : a + m].tolist() == [5] * m
    assert ncls[a + m :].tolist() == [2] * (k - a - m)
    sizes = np.array([len(p) for p in parts])
    assert sizes[:a].mean() > sizes[a + m :].mean()
    shuffled = make_partition("nonbalance", y, k, NonBalanceOptions(abundant_first=False), 0)
    assert sorted((class_counts(y, shuffled, 10) > 0).sum(1)) == sorted(ncls)


# ---------------------------------------------------------------------------- pareto


def test_pareto_class_counts_match_spec_seeds():
    shape = math.log(5) / math.log(4)
    for seed in (0, 1):
        counts = pareto_class_counts(30, 10, shape, "round", np.random.default_rng(seed))
        assert Counter(counts) == {1: 29, 10: 1}
    counts = pareto_class_counts(30, 10, shape, "round", np.random.default_rng(2))
    assert Counter(counts) == {1: 15, 2: 8, 3: 2, 4: 3, 10: 2}


def test_pareto_partition():
    y = balanced(300)
    for rounding in ("round", "ceil"):
        parts = make_partition("pareto", y, 30, ParetoOptions(rounding=rounding), 2)
        ncls = (class_counts(y, parts, 10) > 0).sum(1)
        assert disjoint(parts) and ncls.min() >= 1 and ncls.max() == 10
    x = 1 + np.random.default_rng(2).pareto(ParetoOptions().shape, size=30)
    parts = make_partition("pareto", y, 30, ParetoOptions(), 2)
    assert (class_counts(y, parts, 10)[np.argmax(x)] > 0).all()


def test_biased_unbiased_explicit_shard_fits_uneven_classes():
    # classes of 124..133 samples: the default shard int(1297/10/6) = 21 needs 126 of one class;
    # shard 20 gives 5 biased clients x (2 classes x 100) and one unbiased x (10 x 20)
    from hpcfl.data.partition_labels import BiasedUnbiasedOptions, biased_unbiased

    counts = [128, 132, 127, 133, 131, 132, 131, 129, 124, 130]
    labels = np.repeat(np.arange(10), counts)
    parts = biased_unbiased(labels, 6, BiasedUnbiasedOptions(shard=20), seed=0)
    assert [len(p) for p in parts] == [200] * 6
    assert np.bincount(labels[parts[0]], minlength=10).tolist() == [100, 100] + [0] * 8
    assert np.bincount(labels[parts[5]], minlength=10).tolist() == [20] * 10
    assert len(np.unique(np.concatenate(parts))) == 1200
