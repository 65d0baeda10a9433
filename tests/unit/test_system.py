"""Tests of the simulated clock (hpcfl.system)."""

import math
import os

import numpy as np
import pytest

from hpcfl.errors import ConfigError
from hpcfl.config.options import build
from hpcfl.system import (
    DEADLINE,
    LATE,
    NO_STEPS,
    OK,
    UNAVAILABLE,
    RoundPlan,
    SystemModel,
    SystemOptions,
)

MB = 1_000_000  # model of 1e6 bytes = 8e6 bits: 1 s at 8 Mbit/s

# client, seconds_per_step, uplink_mbps, downlink_mbps
THREE = """client,seconds_per_step,uplink_mbps,downlink_mbps
0,0.5,8,16
1,1.0,4,8
2,2.0,2,4
"""


def opts(**table):
    return build(SystemOptions, {"enabled": True, **table}, "system")


def three(tmp_path, **table):
    path = tmp_path / "devices.csv"
    path.write_text(THREE)
    o = opts(compute_dist="trace", uplink_dist="trace", downlink_dist="trace",
             trace=str(path), **table)
    return SystemModel(o, num_clients=3, seed=0, model_bytes=MB)


def problems_of(**table):
    with pytest.raises(ConfigError) as e:
        build(SystemOptions, table, "system")
    return "\n".join(e.value.problems)


# ---------------------------------------------------------------- hand-computed cohort
#   client  step_s  up  down   download = 8e6/(down*1e6)  upload = 8e6/(up*1e6)
#   0       0.5     8   16     0.5                         1.0
#   1       1.0     4   8      1.0                         2.0
#   2       2.0     2   4      2.0                         4.0

def test_no_deadline_slowest_sets_the_round(tmp_path):
    plan = three(tmp_path).plan(0, np.array([0, 1, 2]), 10)
    np.testing.assert_array_equal(plan.steps, [10, 10, 10])
    np.testing.assert_allclose(plan.download_s, [0.5, 1.0, 2.0])
    np.testing.assert_allclose(plan.upload_s, [1.0, 2.0, 4.0])
    np.testing.assert_allclose(plan.compute_s, [5.0, 10.0, 20.0])  # 10 steps x step_s
    np.testing.assert_allclose(plan.total_s, [6.5, 13.0, 26.0])     # down + compute + up
    assert plan.duration_s == 26.0                                  # max over participants
    assert not plan.dropped.any()


def test_deadline_truncates_and_drops(tmp_path):
    model = three(tmp_path, deadline_s=6.5)
    plan = model.plan(0, np.array([0, 1, 2]), 10)
    # budgets = 6.5 - down - up: 0: 6.5-1.5 = 5.0 -> floor(5/0.5) = 10 -> min(10, 10) = 10
    #                            1: 6.5-3.0 = 3.5 -> floor(3.5/1) = 3
    #                            2: 6.5-6.0 = 0.5 -> floor(0.5/2) = 0 -> dropped
    np.testing.assert_array_equal(plan.steps, [10, 3, 0])
    np.testing.assert_array_equal(plan.dropped, [False, False, True])
    np.testing.assert_array_equal(plan.reason, [OK, OK, DEADLINE])
    np.testing.assert_array_equal(plan.truncated, [False, True, False])
    np.testing.assert_allclose(plan.compute_s, [5.0, 3.0, 0.0])
    np.testing.assert_allclose(plan.total_s, [6.5, 6.0, 0.0])  # 0.5+5+1, 1+3+2, dropped
    np.testing.assert_allclose(plan.step_s, [0.5, 1.0, 2.0])
    assert plan.duration_s == 6.5  # client 2 never reports: the server waits to the deadline
    np.testing.assert_array_equal(plan.participants, [0, 1])


def test_deadline_without_drop_ends_at_last_arrival(tmp_path):
    plan = three(tmp_path, deadline_s=9.5).plan(0, np.array([0, 1, 2]), 10)
    # budgets: 0: 8.0 -> 16 -> 10 steps, total 6.5
    #          1: 6.5 -> 6 steps, total 1 + 6 + 2 = 9.0
    #          2: 3.5 -> 1 step,  total 2 + 2 + 4 = 8.0
    np.testing.assert_array_equal(plan.steps, [10, 6, 1])
    np.testing.assert_allclose(plan.total_s, [6.5, 9.0, 8.0])
    assert plan.duration_s == 9.0


def test_granularity_and_server_time(tmp_path):
    plan = three(tmp_path, deadline_s=10.0, server_s=0.25).plan(
        0, np.array([0, 1, 2]), 10, granularity=5)
    # budgets 8.5, 7, 4 -> fits 17, 7, 2 -> capped 10 (not truncated), 7 -> 5, 2 -> 0 dropped
    np.testing.assert_array_equal(plan.steps, [10, 5, 0])
    np.testing.assert_array_equal(plan.reason, [OK, OK, DEADLINE])
    assert plan.duration_s == 10.25  # deadline (client 2 dropped by it) + server_s


def test_finishing_compute_of_short_clients(tmp_path):
    """finish_steps (FedLGA's full_grad pass) is charged only to clients that end below full_steps, and
    under a deadline such a client stops early enough to fit it. Without a deadline, full work 10 steps:
    client 0 runs 10 (complete, no pass), 1 and 2 were asked 6 (slow): compute (6 + 3) step_s."""
    plan = three(tmp_path).plan(0, np.array([0, 1, 2]), np.array([10, 6, 6]), finish_steps=3,
                                full_steps=np.array([10, 10, 10]))
    np.testing.assert_array_equal(plan.steps, [10, 6, 6])
    np.testing.assert_allclose(plan.compute_s, [5.0, 9.0, 18.0])   # 10 x 0.5, (6 + 3) x 1, (6 + 3) x 2
    np.testing.assert_allclose(plan.total_s, [6.5, 12.0, 24.0])
    # deadline 9.5 (budgets 8, 6.5, 3.5 as above): client 0 fits its 10 steps and needs no pass; client 1
    # fits 6 < 10, so it keeps floor((6.5 - 2 x 1) / 1) = 4 steps and its 2-step pass; client 2 fits 1 step,
    # floor((3.5 - 2 x 2) / 2) < 0: dropped
    plan = three(tmp_path, deadline_s=9.5).plan(0, np.array([0, 1, 2]), 10, finish_steps=np.array([2, 2, 2]))
    np.testing.assert_array_equal(plan.steps, [10, 4, 0])
    np.testing.assert_array_equal(plan.reason, [OK, OK, DEADLINE])
    np.testing.assert_allclose(plan.compute_s, [5.0, 6.0, 0.0])
    np.testing.assert_allclose(plan.total_s, [6.5, 9.0, 0.0])


def test_step_tolerance_floor():
    # 0.3 / 0.1 = 2.9999999999999996 in floats; the slack must still give 3 steps
    m = SystemModel(opts(compute_s=0.1, uplink_mbps=math.inf, deadline_s=0.3), 1, 0, MB)
    assert m.plan(0, np.array([0]), 100).steps[0] == 3


def test_seconds_per_sample_batch_and_delay():
    o = opts(compute_unit="sample", compute_s=0.01, uplink_mbps=8.0, downlink_mbps=math.inf,
             delay_dist="constant", delay_s=0.5, deadline_s=5.0)
    plan = SystemModel(o, 2, 0, MB).plan(3, np.array([0, 1]), 100, batch_sizes=np.array([25, 50]))
    # step_s = 0.01 x batch = 0.25, 0.5; upload 1 s, download 0 (inf); budget 5-1-0.5 = 3.5
    np.testing.assert_allclose(plan.step_s, [0.25, 0.5])
    np.testing.assert_array_equal(plan.steps, [14, 7])      # floor(3.5/0.25), floor(3.5/0.5)
    np.testing.assert_allclose(plan.total_s, [5.0, 5.0])    # 0 + 3.5 + 0.5 + 1
    assert plan.duration_s == 5.0


def test_earliest_k(tmp_path):
    plan = three(tmp_path).plan(0, np.array([2, 0, 1]), 10).earliest(2)
    # arrivals 26 (client 2), 6.5 (client 0), 13 (client 1): keep 0 and 1, close at 13
    np.testing.assert_array_equal(plan.reason, [LATE, OK, OK])
    np.testing.assert_array_equal(plan.steps, [0, 10, 10])
    assert plan.duration_s == 13.0
    # ties go to the lower client id
    m = SystemModel(opts(compute_s=1.0), 10, 0, MB)
    tied = m.plan(0, np.array([7, 3, 5]), 2).earliest(1)
    np.testing.assert_array_equal(tied.participants, [3])


def test_disabled_is_no_clock():
    m = SystemModel(SystemOptions(), 5, 0, MB)
    plan = m.plan(4, np.array([0, 3, 4]), np.array([3, 0, 2]))
    np.testing.assert_array_equal(plan.steps, [3, 0, 2])
    np.testing.assert_array_equal(plan.reason, [OK, NO_STEPS, OK])
    assert plan.duration_s == 0.0 and not plan.total_s.any()


def test_gift_vgg16_calibration():
    # GIFT's VGG-16 setting (Chen et al. 2023): M = 14,728,266 fp32, uplink 5 Mbit/s, free downlink, 2.0058 s/iter, tau 100
    o = opts(compute_s=2.0058, uplink_mbps=5.0, downlink_mbps=math.inf)
    m = SystemModel(o, 100, 1, model_bytes=4 * 14_728_266)
    hours = sum(m.plan(r, np.arange(40), 100).duration_s for r in range(1000)) / 3600
    assert abs(hours - 81.9) < 0.05


def test_plan_is_read_only(tmp_path):
    plan = three(tmp_path).plan(0, np.array([0, 1]), 3)
    with pytest.raises(ValueError):
        plan.steps[0] = 99


# ---------------------------------------------------------------- trace files

def test_trace_is_cycled_in_client_order(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("downlink_mbps,client,seconds_per_sample,extra\n"
                    "inf,20,0.3,x\n\n10,5,0.1,y\n")
    o = opts(compute_unit="sample", compute_dist="trace", downlink_dist="trace",
             trace="t.csv")
    prof = SystemModel(o, 5, 0, MB, base_dir=tmp_path).profile(np.array([0, 1, 2, 3]))
    # rows sorted by id: (5: 0.1, 10 Mbps), (20: 0.3, inf); client c uses row c mod 2
    np.testing.assert_allclose(prof["compute_s"], [0.1, 0.3, 0.1, 0.3])
    np.testing.assert_allclose(prof["downlink_mbps"], [10, math.inf, 10, math.inf])
    np.testing.assert_allclose(prof["uplink_mbps"], 5.0)  # not from the trace


@pytest.mark.parametrize("body, words", [
    ("client,seconds_per_step,uplink_mbps\n0,1,2\n", ["line 1", "downlink_mbps"]),
    ("client,seconds_per_step,uplink_mbps,downlink_mbps\n0,1,2,3\n1,-1,2,3\n",
     ["line 3", "seconds_per_step", "'-1'"]),
    ("client,seconds_per_step,uplink_mbps,downlink_mbps\n0,1,2,3\n1,1,fast,3\n",
     ["line 3", "uplink_mbps", "not a number"]),
    ("client,seconds_per_step,uplink_mbps,downlink_mbps\n0,1,2,3\n0,1,2,3\n",
     ["line 3", "duplicate"]),
    ("client,seconds_per_step,uplink_mbps,downlink_mbps\n", ["no data rows"]),
    ("client,seconds_per_step,uplink_mbps,downlink_mbps\n0,1,2,0\n", ["line 2", "greater than 0"]),
    ("client,seconds_per_step,uplink_mbps,downlink_mbps\nx,1,2,3\n", ["line 2", "not an integer"]),
])
def test_malformed_trace(tmp_path, body, words):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    o = opts(compute_dist="trace", uplink_dist="trace", downlink_dist="trace", trace=str(path))
    with pytest.raises(ConfigError) as e:
        SystemModel(o, 4, 0, MB)
    msg = str(e.value)
    for w in ["system.trace", str(path)] + words:
        assert w in msg, (w, msg)


def test_missing_trace_file(tmp_path):
    o = opts(compute_dist="trace", trace=str(tmp_path / "nope.csv"))
    with pytest.raises(ConfigError, match="system.trace"):
        SystemModel(o, 4, 0, MB)



@pytest.mark.timeout(60)   # a FIFO blocked open() for good (issue 37.3)
def test_a_trace_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "trace.csv")
    o = opts(compute_dist="trace", trace=str(tmp_path / "trace.csv"))
    with pytest.raises(ConfigError, match="system.trace.*not a regular file but a FIFO"):
        SystemModel(o, 4, 0, MB)


# ---------------------------------------------------------------- purity

def rich(seed, n=1000):
    o = opts(compute_dist="lognormal", compute_s=0.2, compute_sigma=0.8,
             uplink_dist="uniform", uplink_low_mbps=1.0, uplink_high_mbps=20.0,
             downlink_dist="lognormal", downlink_mbps=50.0, downlink_sigma=0.5,
             unavailability=0.2, slowdown_dist="uniform", slowdown_min=0.3,
             delay_dist="exponential", delay_s=0.5, deadline_s=4.0)
    return SystemModel(o, n, seed, model_bytes=MB)


ARRAYS = ("clients", "planned", "steps", "dropped", "reason", "step_s", "download_s",
          "compute_s", "delay_s", "upload_s", "total_s")


def test_plan_equals_concatenation_of_any_split():
    m = rich(7)
    rng = np.random.default_rng(0)
    cohort = rng.choice(1000, size=60, replace=False)
    planned = rng.integers(0, 40, size=60)
    batch = rng.integers(1, 64, size=60)
    whole = m.plan(12, cohort, planned, batch)
    assert 0 < whole.dropped.sum() < 60 and whole.truncated.any()
    for cuts in ([20, 45], [1], [30, 31, 59]):
        parts = [rich(7).plan(12, c, p, b) for c, p, b in zip(
            np.split(cohort, cuts), np.split(planned, cuts), np.split(batch, cuts))]
        for name in ARRAYS:
            np.testing.assert_array_equal(
                getattr(whole, name), np.concatenate([getattr(p, name) for p in parts]))
        assert whole.duration_s == max(p.duration_s for p in parts)
    perm = rng.permutation(60)
    shuffled = m.plan(12, cohort[perm], planned[perm], batch[perm])
    np.testing.assert_array_equal(shuffled.total_s, whole.total_s[perm])
    prof = m.profile(np.arange(1000))
    sub = m.profile(cohort)
    for k in prof:
        np.testing.assert_array_equal(prof[k][cohort], sub[k])


def test_seed_and_round_dependence():
    cohort, planned = np.arange(0, 1000, 17), 30
    a, b, c = rich(7).plan(3, cohort, planned), rich(7).plan(3, cohort, planned), \
        rich(8).plan(3, cohort, planned)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.duration_s == b.duration_s
    assert not np.array_equal(a.total_s, c.total_s)
    assert not np.array_equal(rich(7).profile(cohort)["compute_s"],
                              rich(8).profile(cohort)["compute_s"])
    # the static profile does not change with the round, the per-round draws do
    m = rich(7)
    assert not np.array_equal(m.delay(3, cohort), m.delay(4, cohort))
    assert not np.array_equal(m.slowdown(3, cohort), m.slowdown(4, cohort))


def test_profile_of_many_clients_is_fast():
    import time
    m = rich(1, n=100_000)
    t = time.perf_counter()
    m.profile(np.arange(100_000))
    m.plan(0, np.arange(100_000), 10)
    assert time.perf_counter() - t < 2.0


def test_distributions():
    m = rich(3, n=200_000)
    everyone = np.arange(200_000)
    prof = m.profile(everyone)
    assert abs(prof["compute_s"].mean() / 0.2 - 1) < 0.02       # lognormal keeps its mean
    assert abs(np.log(prof["downlink_mbps"]).std() - 0.5) < 0.01
    up = prof["uplink_mbps"]
    assert up.min() >= 1.0 and up.max() <= 20.0 and abs(up.mean() - 10.5) < 0.1
    xi = m.slowdown(2, everyone)
    assert xi.min() > 0.3 and xi.max() <= 1.0 and abs(xi.mean() - 0.65) < 0.01
    assert abs(m.delay(2, everyone).mean() - 0.5) < 0.01


# ---------------------------------------------------------------- availability

def test_unavailability_fraction_and_determinism():
    m = SystemModel(opts(unavailability=0.3), 500, 11, MB)
    clients = np.arange(500)
    draws = np.array([m.available(r, clients) for r in range(200)])
    assert abs(1 - draws.mean() - 0.3) < 0.01  # 1e5 draws: std 0.0015
    again = SystemModel(opts(unavailability=0.3), 500, 11, MB)
    np.testing.assert_array_equal(draws[17], again.available(17, clients))
    assert not np.array_equal(draws[17], draws[18])
    plan = m.plan(17, clients, 5)
    np.testing.assert_array_equal(plan.reason == UNAVAILABLE, ~draws[17])
    assert SystemModel(opts(), 500, 11, MB).available(5, clients).all()
    assert not SystemModel(opts(unavailability=1.0), 9, 0, MB).available(0, np.arange(9)).any()


def test_unavailable_clients_do_not_extend_the_round(tmp_path):
    m = three(tmp_path, unavailability=0.5)
    plans = [m.plan(r, np.array([0, 1, 2]), 10) for r in range(40)]
    plan = next(p for p in plans if p.reason[2] == UNAVAILABLE and not p.dropped[:2].any())
    assert plan.duration_s == 13.0 and plan.total_s[2] == 0


# ---------------------------------------------------------------- options

@pytest.mark.parametrize("table, key", [
    ({"uplink_mbps": -1.0}, "system.uplink_mbps"),
    ({"downlink_low_mbps": -2.0}, "system.downlink_low_mbps"),
    ({"deadline_s": 0.0}, "system.deadline_s"),
    ({"deadline_s": -3}, "system.deadline_s"),
    ({"compute_dist": "gamma"}, "system.compute_dist"),
    ({"compute_unit": "epoch"}, "system.compute_unit"),
    ({"unavailability": 1.5}, "system.unavailability"),
    ({"slowdown_min": 0.0}, "system.slowdown_min"),
    ({"compute_s": "fast"}, "system.compute_s"),
    ({"delay_s": -1.0}, "system.delay_s"),
    ({"uplink_dist": "uniform"}, "system.uplink_low_mbps"),
    ({"uplink_dist": "uniform", "uplink_low_mbps": 5.0, "uplink_high_mbps": 1.0},
     "system.uplink_low_mbps"),
    ({"compute_dist": "lognormal"}, "system.compute_sigma"),
    ({"compute_dist": "trace"}, "system.trace"),
    ({"trace": "x.csv"}, "system.trace"),
    ({"delay_dist": "uniform"}, "system.delay_low_s"),
    ({"compute_s": math.inf}, "system.compute_s"),
    ({"deadline": 3.0}, "system.deadline"),
])
def test_bad_options_name_the_key(table, key):
    assert key in problems_of(**table)


def test_defaults_and_inf_bandwidth():
    o = build(SystemOptions, None, "system")
    assert o == SystemOptions() and not o.enabled and o.deadline_s is None
    o = build(SystemOptions, {"enabled": True, "uplink_mbps": math.inf, "deadline_s": 2},
              "system")
    plan = SystemModel(o, 1, 0, MB).plan(0, np.array([0]), 4)
    assert plan.upload_s[0] == 0 and plan.download_s[0] == 0
    assert plan.duration_s == pytest.approx(0.4)


def test_bad_arguments():
    m = rich(0, n=10)
    with pytest.raises(ValueError):
        m.plan(0, np.array([10]), 1)
    with pytest.raises(ValueError):
        m.plan(0, np.array([1]), -1)
    with pytest.raises(ValueError):
        m.plan(-1, np.array([1]), 1)
    assert isinstance(m.plan(0, np.array([], dtype=np.int64), 1), RoundPlan)
