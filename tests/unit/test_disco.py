"""FedDisco weights (Ye et al., ICML 2023, eq. 3): hand-computed fixtures and properties.

Fixtures A-C and the edge cases are worked by hand (fractions where they exist); the
property tests draw at least 200 seeded cases each.
"""

import math

import numpy as np
import pytest

from hpcfl.algorithms.disco import DiscoOptions, discrepancy, disco_weights, target_distribution
from hpcfl.errors import ConfigError
from hpcfl.config.options import build

TOL = 1e-7
CASES = 250

# ---------------------------------------------------------------- Fixture A (C = 4)
A = np.array([[25, 25, 25, 25], [50, 50, 0, 0], [100, 0, 0, 0], [100, 100, 100, 100]], dtype=np.int64)
A_SIZES = A.sum(axis=1)
A_N = np.array([1, 1, 1, 4]) / 7
UNIFORM4 = np.full(4, 0.25)


def a_weights(metric, normalize=True, a=0.5, b=0.1, clients=slice(None)):
    d_raw = discrepancy(A, UNIFORM4, metric)
    return disco_weights(A_SIZES[clients], d_raw[clients], a=a, b=b, normalize=normalize)


def test_a1_raw_kl():
    assert np.allclose(discrepancy(A, UNIFORM4, "kl"), [0, math.log(2), math.log(4), 0], atol=TOL, rtol=0)
    assert np.allclose(discrepancy(A, UNIFORM4, "kl"), [0, 0.6931472, 1.3862944, 0], atol=TOL, rtol=0)


def test_a2_normalised_kl():
    _, info = a_weights("kl")
    assert np.allclose(info["d_norm"], [0, 1 / 3, 2 / 3, 0], atol=TOL, rtol=0)


def test_a3_kl_weights():
    p, info = a_weights("kl")
    assert np.allclose(p, np.array([51, 16, 0, 141]) / 208, atol=TOL, rtol=0)
    assert np.allclose(p, [0.2451923, 0.0769231, 0, 0.6778846], atol=TOL, rtol=0)
    assert np.allclose(info["q"], np.array([51, 16, 0, 141]) / 210, atol=TOL, rtol=0)
    assert info["zeroed"].tolist() == [False, False, True, False]
    assert info["fallback"] is False
    assert p.dtype == np.float64 and p[2] == 0.0


def test_a4_l2():
    assert np.allclose(discrepancy(A, UNIFORM4, "l2"), [0, 0.5, 0.8660254, 0], atol=TOL, rtol=0)
    p, _ = a_weights("l2")
    assert np.allclose(p, [0.2493067, 0.0614337, 0, 0.6892596], atol=TOL, rtol=0)


def test_a5_l1():
    assert np.allclose(discrepancy(A, UNIFORM4, "l1"), [0, 1, 1.5, 0], atol=TOL, rtol=0)
    p, info = a_weights("l1")
    assert np.allclose(info["d_norm"], [0, 0.4, 0.6, 0], atol=TOL, rtol=0)
    assert np.allclose(p, np.array([17, 3, 0, 47]) / 67, atol=TOL, rtol=0)


def test_a6_cosine():
    assert np.allclose(discrepancy(A, UNIFORM4, "cosine"), [0, 0.2928932, 0.5, 0], atol=TOL, rtol=0)
    p, _ = a_weights("cosine")
    assert np.allclose(p, [0.2497390, 0.0598061, 0, 0.6904549], atol=TOL, rtol=0)


@pytest.mark.parametrize("metric", ["kl", "l2", "l1"])
def test_a7_raw_metrics(metric):
    p, info = a_weights(metric, normalize=False)
    assert np.allclose(p, [17 / 64, 0, 0, 47 / 64], atol=TOL, rtol=0)
    assert np.allclose(info["d_norm"], discrepancy(A, UNIFORM4, metric), atol=0, rtol=0)


def test_a7_raw_cosine():
    p, _ = a_weights("cosine", normalize=False)
    assert np.allclose(p, [0.2402870, 0.0953902, 0, 0.6643228], atol=TOL, rtol=0)


def test_a8_zero_a_and_b_is_fedavg_exactly():
    p, info = a_weights("kl", a=0.0, b=0.0)
    assert np.array_equal(p, A_SIZES / A_SIZES.sum())
    assert np.allclose(p, A_N, atol=TOL, rtol=0) and info["fallback"] is False


def test_a9_zero_a():
    p, _ = a_weights("kl", a=0.0, b=0.1)
    assert np.allclose(p, (A_N + 0.1) / 1.4, atol=TOL, rtol=0)


def test_a10_partial_set_renormalises_n_and_d():
    p, info = a_weights("kl", clients=[1, 2])
    assert np.allclose(info["d_norm"], [1 / 3, 2 / 3], atol=TOL, rtol=0)
    assert np.allclose(p, [13 / 21, 8 / 21], atol=TOL, rtol=0)
    assert np.allclose(p, [0.6190476, 0.3809524], atol=TOL, rtol=0)


def test_a11_global_target():
    t = target_distribution("global", A)
    assert np.allclose(t, np.array([11, 7, 5, 5]) / 28, atol=1e-15, rtol=0)
    d_raw = discrepancy(A, t, "kl")
    assert np.allclose(d_raw, [0.0552398, 0.4671546, 0.9343092, 0.0552398], atol=TOL, rtol=0)
    _, info = disco_weights(A_SIZES, d_raw)
    assert np.allclose(info["d_norm"], [0.0365356, 0.3089762, 0.6179525, 0.0365356], atol=TOL, rtol=0)


def test_other_targets():
    assert np.array_equal(target_distribution("uniform", A), UNIFORM4)
    with_empty = np.vstack([A, np.zeros(4, dtype=np.int64)])   # empty clients are skipped
    for counts in (A, with_empty):
        assert np.allclose(target_distribution("unweighted_mean", counts), [0.5, 0.25, 0.125, 0.125],
                           atol=1e-15, rtol=0)
    assert np.allclose(target_distribution("explicit", A, (2, 1, 1, 0)), [0.5, 0.25, 0.25, 0], atol=0, rtol=0)
    with pytest.raises(ConfigError, match=r"algorithm\.disco\.target_vector has 3 values .* 4 classes"):
        target_distribution("explicit", A, (1, 1, 1))


# ---------------------------------------------------------------- Fixture B (NIID-2, C = 10)
def niid2_counts():
    counts = np.zeros((6, 10), dtype=np.int64)
    for i in range(5):
        counts[i, 2 * i: 2 * i + 2] = 4165
    counts[5] = 833
    return counts


def niid2_weights(a, b):
    counts = niid2_counts()
    return disco_weights(counts.sum(axis=1), discrepancy(counts, np.full(10, 0.1), "kl"), a=a, b=b)


def test_b_niid2_default():
    counts = niid2_counts()
    assert (counts.sum(axis=1) == 8330).all()
    d_raw = discrepancy(counts, target_distribution("uniform", counts), "kl")
    assert np.allclose(d_raw, [math.log(5)] * 5 + [0], atol=TOL, rtol=0)
    assert np.allclose(d_raw[:5], 1.6094379, atol=TOL, rtol=0)
    p, info = niid2_weights(0.5, 0.1)
    assert np.allclose(info["d_norm"], [0.2] * 5 + [0], atol=TOL, rtol=0)
    assert np.allclose(p, [5 / 33] * 5 + [8 / 33], atol=TOL, rtol=0)
    assert np.allclose(p, [0.1515152] * 5 + [0.2424242], atol=TOL, rtol=0)


@pytest.mark.parametrize("a, b, biased, unbiased", [
    (0.4, 0.1, 0.1555556, 0.2222222),
    (0.6, 0.1, 0.1466667, 0.2666667),
    (0.2, 0.05, 0.1606061, 0.1969697),
    (0.7, 0.4, 0.1580247, 0.2098765),
    (1.0, 0.0, 0.0, 1.0),
])
def test_b_niid2_ab_table(a, b, biased, unbiased):
    p, _ = niid2_weights(a, b)
    assert np.allclose(p, [biased] * 5 + [unbiased], atol=TOL, rtol=0)


@pytest.mark.parametrize("b", [0.0, 0.1, 0.4, 3.0])
def test_b_niid2_zero_a_is_uniform(b):
    p, _ = niid2_weights(0.0, b)
    assert np.allclose(p, np.full(6, 1 / 6), atol=1e-15, rtol=0)


# ---------------------------------------------------------------- Fixture C and edge cases
def test_c_fallback_to_sizes():
    """Every q = n - 5 d~ <= 0 (sizes 100 and 300: n = 1/4, 3/4; d~ = 1/2 each): p is the size weights
    n = [1/4, 3/4] exactly, not equal weights."""
    p, info = disco_weights([100, 300], [0.3, 0.3], a=5.0, b=0.0)
    assert np.allclose(info["d_norm"], [0.5, 0.5], atol=TOL, rtol=0)
    assert np.array_equal(p, [0.25, 0.75])
    assert info["fallback"] is True and info["zeroed"].all() and (info["q"] == 0).all()


@pytest.mark.parametrize("b", [0.0, 0.1, 0.7])
def test_all_uniform_clients_get_size_plus_offset(b):
    counts = np.array([[3, 3, 3], [10, 10, 10], [1, 1, 1]])
    sizes = counts.sum(axis=1)
    for metric in ("kl", "l1", "l2", "cosine"):
        d_raw = discrepancy(counts, np.full(3, 1 / 3), metric)
        assert np.allclose(d_raw, 0, atol=1e-15, rtol=0) and (d_raw >= 0).all()
        p, info = disco_weights(sizes, d_raw, a=0.5, b=b)
        n = sizes / sizes.sum()
        assert np.isfinite(p).all() and not np.isnan(info["d_norm"]).any()
        assert np.allclose(p, (n + b) / (1 + 3 * b), atol=1e-12, rtol=0)


@pytest.mark.parametrize("num_classes", [2, 4, 10, 100])
def test_single_class_client_kl_is_log_c(num_classes):
    counts = np.zeros((1, num_classes), dtype=np.int64)
    counts[0, num_classes - 1] = 37
    d_raw = discrepancy(counts, np.full(num_classes, 1 / num_classes), "kl")
    assert np.allclose(d_raw, [math.log(num_classes)], atol=1e-12, rtol=0)


def test_explicit_target_with_zero_where_client_has_mass():
    t = target_distribution("explicit", A, (0.5, 0.5, 0.0, 0.0))
    with pytest.raises(ConfigError) as err:
        discrepancy(A, t, "kl")
    msg = str(err.value)
    assert "infinite" in msg and "client 0" in msg and "class 2" in msg and "positive target mass" in msg
    # only KL is undefined there; the other metrics are finite
    assert np.isfinite(discrepancy(A, t, "l1")).all()


def test_bad_inputs_raise_config_error():
    with pytest.raises(ConfigError, match="positive sample count"):
        disco_weights([10, 0], [0.1, 0.2])
    with pytest.raises(ConfigError, match="non-negative"):
        disco_weights([10, 10], [0.1, -0.2])
    with pytest.raises(ConfigError, match="equal-length"):
        disco_weights([10, 10], [0.1])
    with pytest.raises(ConfigError, match="'js' is not valid"):
        discrepancy(A, UNIFORM4, "js")
    with pytest.raises(ConfigError, match="'median' is not valid"):
        target_distribution("median", A)


# ---------------------------------------------------------------- properties (seeded numpy)
def random_round(rng, equal_sizes=False):
    """Random (sizes, d_raw, a, b, normalize) from real histograms and all four metrics."""
    k, c = int(rng.integers(1, 13)), int(rng.integers(2, 11))
    counts = rng.integers(0, 50, size=(k, c)) * (rng.random((k, c)) < 0.6)
    counts[np.arange(k), rng.integers(0, c, size=k)] += 1       # every client non-empty
    if equal_sizes:
        counts[:, -1] += counts.sum(axis=1).max() - counts.sum(axis=1)
    target = target_distribution(str(rng.choice(["uniform", "global", "unweighted_mean"])), counts)
    d_raw = discrepancy(counts, target, str(rng.choice(["kl", "l1", "l2", "cosine"])))
    a = float(rng.choice([0.0, rng.uniform(0, 0.1), rng.uniform(0, 1), rng.uniform(0, 5)]))
    b = float(rng.choice([0.0, rng.uniform(0, 0.5)]))
    return counts.sum(axis=1), d_raw, a, b, bool(rng.random() < 0.8)


def test_property_weights_are_a_distribution():
    rng = np.random.default_rng(101)
    for _ in range(CASES):
        sizes, d_raw, a, b, norm = random_round(rng)
        p, _ = disco_weights(sizes * 10.0 ** rng.integers(-3, 7), d_raw, a, b, norm)
        assert np.isfinite(p).all() and (p >= 0).all() and abs(p.sum() - 1) < 1e-12


def test_property_permutation_equivariance():
    rng = np.random.default_rng(102)
    for _ in range(CASES):
        sizes, d_raw, a, b, norm = random_round(rng)
        perm = rng.permutation(sizes.size)
        p, _ = disco_weights(sizes, d_raw, a, b, norm)
        p_perm, _ = disco_weights(sizes[perm], d_raw[perm], a, b, norm)
        assert np.allclose(p_perm, p[perm], atol=1e-14, rtol=0)


def test_property_integer_scaling_keeps_discrepancy():
    rng = np.random.default_rng(103)
    for _ in range(CASES):
        k, c = int(rng.integers(1, 8)), int(rng.integers(2, 11))
        counts = rng.integers(0, 40, size=(k, c))
        counts[:, 0] += 1
        scaled = counts.copy()
        row = int(rng.integers(k))
        scaled[row] *= int(rng.integers(2, 1000))
        for metric in ("kl", "l1", "l2", "cosine"):
            t = np.full(c, 1 / c)
            assert np.allclose(discrepancy(scaled, t, metric), discrepancy(counts, t, metric),
                               atol=1e-14, rtol=1e-12)


def test_property_monotone_in_discrepancy_for_equal_sizes():
    rng = np.random.default_rng(104)
    for _ in range(CASES):
        sizes, d_raw, a, b, norm = random_round(rng, equal_sizes=True)
        p, _ = disco_weights(sizes, d_raw, a, b, norm)
        more = d_raw[:, None] > d_raw[None, :]               # more[i, j]: d_i > d_j
        assert (p[:, None] <= p[None, :])[more].all()


def test_property_monotone_in_size_for_equal_discrepancy():
    rng = np.random.default_rng(105)
    for _ in range(CASES):
        sizes, _, a, b, norm = random_round(rng)
        p, _ = disco_weights(sizes, np.full(sizes.size, rng.uniform(0, 2)), a, b, norm)
        bigger = sizes[:, None] > sizes[None, :]
        assert (p[:, None] >= p[None, :])[bigger].all()


def test_property_identity_for_unclipped_clients():
    rng = np.random.default_rng(106)
    for _ in range(CASES):
        sizes, d_raw, a, b, norm = random_round(rng)
        p, info = disco_weights(sizes, d_raw, a, b, norm)
        n, q = sizes / sizes.sum(), info["q"]
        live = q > 0
        z = q.sum()
        assert np.allclose((z * p - n)[live], (b - a * info["d_norm"])[live], atol=1e-12, rtol=0)


def test_property_equal_sizes_down_weight_discrepancy():
    rng = np.random.default_rng(107)
    strict = 0
    for _ in range(CASES):
        sizes, d_raw, a, b, _ = random_round(rng, equal_sizes=True)
        if d_raw.sum() <= 0:
            continue
        p, info = disco_weights(sizes, d_raw, a, b, normalize=True)
        d = info["d_norm"]
        fedavg = (sizes / sizes.sum()) @ d
        assert abs(fedavg - 1 / sizes.size) < 1e-12
        assert p @ d <= fedavg + 1e-15
        # strict unless a = 0, all d equal, or every q clipped (p falls back to n)
        if a > 0 and np.ptp(d) > 0 and not info["fallback"]:
            assert p @ d < fedavg
            strict += 1
    assert strict > CASES // 3


def test_property_zero_a_and_b_is_bitwise_fedavg():
    rng = np.random.default_rng(108)
    naive_differs = 0
    for _ in range(CASES):
        sizes, d_raw, _, _, norm = random_round(rng)
        sizes = sizes * int(rng.integers(1, 10 ** 6))
        n = sizes / sizes.sum()
        p, _ = disco_weights(sizes, d_raw, 0.0, 0.0, norm)
        assert np.array_equal(p, n)
        naive_differs += not np.array_equal(n / n.sum(), n)
    assert naive_differs > 0      # q / q.sum() would have broken bit-equality: the test has teeth


# ---------------------------------------------------------------- options
def test_options_defaults_are_valid():
    o = DiscoOptions()
    got = (o.metric, o.target, o.target_vector, o.a, o.b, o.normalize)
    assert got == ("kl", "uniform", (), 0.5, 0.1, True)
    assert o.validate() == []
    assert DiscoOptions(target="explicit", target_vector=(0.2, 0.8)).validate() == []


@pytest.mark.parametrize("kwargs, message", [
    ({"target": "explicit"}, "target = 'explicit' needs target_vector (one probability per class)"),
    ({"target": "explicit", "target_vector": (0.5, -0.1)},
     "target_vector must be non-negative and sum to a positive number"),
    ({"target": "explicit", "target_vector": (0.0, 0.0)},
     "target_vector must be non-negative and sum to a positive number"),
    ({"target": "explicit", "target_vector": (0.5, math.inf)},
     "target_vector must contain finite numbers only"),
    ({"target_vector": (0.5, 0.5)},
     "target_vector is set but target = 'uniform'; set target = 'explicit' or remove target_vector"),
])
def test_options_validate_messages(kwargs, message):
    assert DiscoOptions(**kwargs).validate() == [message]


def test_options_build_names_the_key():
    o = build(DiscoOptions, {"target": "explicit", "target_vector": [1, 2, 1]}, "algorithm.disco")
    assert o.target_vector == (1.0, 2.0, 1.0)
    with pytest.raises(ConfigError) as err:
        build(DiscoOptions, {"metric": "js", "a": -1}, "algorithm.disco")
    assert "algorithm.disco.metric = 'js' is not valid" in str(err.value)
    assert "algorithm.disco.a = -1.0 must be at least 0" in str(err.value)
    with pytest.raises(ConfigError, match=r"algorithm\.disco: target = 'explicit' needs target_vector"):
        build(DiscoOptions, {"target": "explicit"}, "algorithm.disco")


@pytest.mark.parametrize("metric", ["kl", "l1", "l2", "cosine"])
def test_each_clients_discrepancy_is_independent_of_the_other_rows(metric):
    # each rank computes its own clients' d; a row must not round differently with the block it is in
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 50, size=(37, 10))
    counts[:, 0] += 1
    target = np.full(10, 0.1)
    full = discrepancy(counts, target, metric)
    for rows in ([0], [3, 4, 5], list(range(1, 37, 3)), list(range(20))):
        assert discrepancy(counts[rows], target, metric).tobytes() == full[rows].tobytes()
