"""GIFT's policy on the round protocol: what it packs, what it reads back, and its records.

The pure metric and controllers are checked in test_tau_control.py; here the engine side:
the segments, the weights, the buffers left out (spec A7), the state round trip, the events
table, and configuration errors.
"""

import numpy as np
import torch
import pytest
from runner import job, run_memory

from hpcfl import config
from hpcfl.algorithms import SCALARS, Algorithm
from hpcfl.algorithms.gift import GiftOptions, GiftSteps, events_table
from hpcfl.errors import ConfigError


class _Res:
    """The part of a ClientResult GIFT reads: the update, a tensor as the engine's (its device's)."""

    def __init__(self, delta):
        self.delta = torch.as_tensor(np.asarray(delta, dtype=np.float64))

    def host(self):
        return self.delta


def _sums(policy, updates, weights, buffers):
    """Reduced segments and scalars of a cohort, as the engine would hand them to rank 0."""
    P = policy.P
    seg = {"delta": np.zeros(P + len(buffers[0]))}
    for name in [s.name for s in policy.segments()]:
        seg[name] = np.zeros(P)
    for u, w, b in zip(updates, weights, buffers):
        seg["delta"] += w * np.concatenate([u, b])
        for name, v in policy.pack(None, 0, 0, _Res(np.concatenate([u, b])), w).items():
            seg[name] += np.asarray(v)
    sc = {"weight": float(sum(weights)), "count": float(len(updates))}
    return seg, sc


A4 = ([np.array([1.0, -2.0, 0.0]), np.array([3.0, 2.0, 0.0])])


@pytest.mark.parametrize("own_sum", [False, True])
def test_A4_hand_example_through_pack_and_sums(own_sum):
    """Spec A4 through the policy's own pack and read-back: u1 = [1, -2, 0], u2 = [3, 2, 0], theta = 0
    gives S = [4, 0, 0], A = [4, 4, 0], so coord_mean C = (1 + 0 + 0) / 3. With two buffer entries
    after the 3 parameters, and with the update sum packed by GIFT itself (own_sum, as under FedNova's
    rule) or read from the delta segment."""
    pol = GiftSteps(GiftOptions(theta=0.0), 4, 3, own_sum)
    seg, sc = _sums(pol, A4, [1.0, 1.0], [np.array([5.0, -7.0]), np.array([0.5, 9.0])])
    np.testing.assert_array_equal(seg["gift_abs"], [4.0, 4.0, 0.0])
    pol.decide(None, seg, sc)
    assert pol.C == pytest.approx(1.0 / 3.0, abs=1e-15)


def test_A4_l1_reduce_through_the_policy():
    """Spec A4, l1: ||S||_1 / ||A||_1 = 4 / 8 = 0.5."""
    pol = GiftSteps(GiftOptions(theta=0.0, reduce="l1"), 4, 3, False)
    pol.decide(None, *_sums(pol, A4, [1.0, 1.0], [np.zeros(1), np.zeros(1)]))
    assert pol.C == pytest.approx(0.5, abs=1e-15)


def test_A7_buffers_do_not_change_C():
    """Spec A7: random values added to the batch-norm entries (after the trainable prefix) of every
    update leave C bitwise unchanged; so does any change of the weights' common scale (uniform
    weights 1 vs 1/k both pool the plain sum)."""
    rng = np.random.default_rng(0)
    ups = [rng.normal(size=6) for _ in range(4)]
    out = []
    for bufs, w in (([np.zeros(3)] * 4, 1.0), ([rng.normal(size=3) * 100 for _ in range(4)], 1.0),
                    ([rng.normal(size=3) for _ in range(4)], 0.25)):
        pol = GiftSteps(GiftOptions(theta=0.5), 4, 6, False)
        for _ in range(3):
            pol.decide(None, *_sums(pol, ups, [w] * 4, bufs))
        out.append(pol.C)
    assert out[0] == out[1]
    assert out[2] == pytest.approx(out[0], rel=1e-14)


def test_size_weights_pool_the_weighted_sum_rescaled_to_the_count():
    """Under unequal weights the pools hold (n / sum w) sum w_i u_i: with weights 3 and 1 on
    u1 = [1], u2 = [-1] and theta = 0, S = 2 (3 - 1) / 4 = 1 and A = 2 (3 + 1) / 4 = 2, so C = 0.5;
    pool_normalize = mean gives the same C (a common factor)."""
    for mode in ("sum", "mean"):
        pol = GiftSteps(GiftOptions(theta=0.0, pool_normalize=mode), 4, 1, False)
        pol.decide(None, *_sums(pol, [np.array([1.0]), np.array([-1.0])], [3.0, 1.0], [np.zeros(0)] * 2))
        assert pol.C == pytest.approx(0.5, abs=1e-15)


def test_nobody_reported_keeps_tau_and_records_nan():
    pol = GiftSteps(GiftOptions(), 4, 2, False)
    tau = pol.decide(None, {"delta": np.zeros(2), "gift_abs": np.zeros(2)}, {"weight": 0.0, "count": 0.0})
    assert tau == (4, "") and np.isnan(pol.C)


def test_B5_state_round_trip_continues_bitwise():
    """Spec B5 at the policy level: the checkpointed arrays (tau_control, gift_pools) loaded into a
    fresh policy continue the same tau and C sequence, bit for bit."""
    rng = np.random.default_rng(1)
    opts = GiftOptions(patience=2, warmup=2, eps_abs=0.0)
    a, b = GiftSteps(opts, 16, 5, False), GiftSteps(opts, 16, 5, False)
    data = [[rng.normal(size=5) * 0.97**r for _ in range(3)] for r in range(40)]
    trail = []
    for r, ups in enumerate(data):
        if r == 20:
            for item_a, item_b in zip(a.state(), b.state()):
                item_b.set(np.array(item_a.get(), copy=True))
        for pol in (a, b) if r >= 20 else (a,):
            tau, _ = pol.decide(None, *_sums(pol, ups, [1.0] * 3, [np.zeros(0)] * 3))
            pol.receive(tau)
        if r >= 20:
            trail.append((a.tau, a.C, a.iters) == (b.tau, b.C, b.iters))
    assert all(trail) and a.iters > 0


def test_default_options_divide_on_relative_stagnation_and_reset_the_pools():
    """GiftOptions() defaults through the policy (theta 0 so that C is each round's raw metric, S = c and
    A = 1 on one coordinate): C = 0.66 * 0.995^r improves by 0.5% a round, under the default eps_rel = 0.1
    no new minimum comes after round 2, so tau halves at round 12 (patience 10); and the default reset
    leaves both pools zero right after that change (test_tau_control.py has the hand-worked cases)."""
    pol = GiftSteps(GiftOptions(theta=0.0), 16, 1, False)
    events = []
    for r in range(1, 13):
        c = 0.66 * 0.995**r
        seg = {"delta": np.array([c]), "gift_abs": np.array([1.0])}
        tau, why = pol.decide(None, seg, {"weight": 1.0, "count": 1.0})
        pol.receive(tau)
        events += [(r, tau, why)] if why else []
    assert events == [(12, 8, "stagnation")]
    assert not pol.ctl.pools().any()


def test_events_table_lists_the_changes():
    t = events_table([1, 2, 3, 4], [8, 8, 4, 4], [8, 4, 4, 9], [0, 1, 0, 2])
    assert t.tolist() == [(2, 8, 4, b"stagnation"), (4, 4, 9, b"relax")]
    assert events_table([1], [3], [3], [0]).shape == (0,)


def test_segments_and_transfer_in_the_layout():
    """The reduction row is [delta (L) | gift_abs (P) | scalars] under the average rule, plus gift_sum (P)
    under FedNova's; GIFT charges nothing to the simulated clock."""
    for server, extra in (("average", 1), ("nova", 2)):
        cfg = config.from_dict(job(**{"algorithm.name": "gift", "algorithm.server": server}))
        algo = Algorithm(cfg, 10, 8, 2, "cpu", None, np.array([5, 5, 5]))
        assert algo.layout.length == 10 + extra * 8 + len(SCALARS)
        assert algo.transfer() == (0, 0)


def test_tau_policies_start_from_local_epochs_worth_without_tau0():
    """local_steps unset: tau0 = round(mean_i E ceil(n_i / B)) with the job's E = 1, B = 16."""
    from mpi4py import MPI

    from hpcfl.engine import simulation

    for name in ("gift", "adacomm", "afl"):
        setup = simulation.prepare(config.from_dict(job(**{"algorithm.name": name, "algorithm.local_steps": 0})),
                                   MPI.COMM_SELF)
        assert setup.algo.steps_policy.tau == int(np.rint(np.mean(-(-setup.sizes // 16)))), name


def test_afl_without_clock_counts_time_in_local_iterations():
    """Neither c nor b given: c = 1, b = tau0, said in a note, and the run decides tau* after its
    trial; one of the two given alone is refused, naming both keys."""
    from mpi4py import MPI

    from hpcfl.engine import simulation

    table = job(**{"algorithm.name": "afl", "algorithm.local_steps": 4, "run.rounds": 12})
    setup = simulation.prepare(config.from_dict(table), MPI.COMM_SELF)
    assert (setup.algo.steps_policy.c, setup.algo.steps_policy.b) == (1.0, 4.0)
    assert any("c = 1 per iteration, b = tau0 = 4" in n for n in setup.algo.notes)
    _, metrics, _ = run_memory(table, MPI.COMM_SELF)
    assert [m["tau_used"] for m in metrics[:10]] == [4] * 10 and metrics[10]["tau_used"] == metrics[9]["tau_next"]
    with pytest.raises(ConfigError, match="algorithm.afl.compute_s and algorithm.afl.comm_s"):
        run_memory(job(**{"algorithm.name": "afl", "algorithm.local_steps": 4, "run.rounds": 12,
                          "algorithm.afl.compute_s": 0.1}), MPI.COMM_SELF)


def test_controller_parameter_errors_name_the_table():
    """A tau_max below tau0 (or AdaComm's interval_s without the clock) is a configuration error that
    names the table, not a traceback from the controller."""
    with pytest.raises(ConfigError, match=r"\[algorithm.gift\].*tau_max"):
        GiftSteps(GiftOptions(tau_max=50), 100, 3, False)
    from hpcfl.algorithms.gift import AdaCommOptions, AdaCommSteps

    with pytest.raises(ConfigError, match=r"\[algorithm.adacomm\].*clock"):
        AdaCommSteps(AdaCommOptions(interval_s=5.0), 10, clock=False)
