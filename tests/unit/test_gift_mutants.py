"""Mutation-driven checks of :mod:`hpcfl.algorithms.gift` (issue 48).

Each test pins one behaviour that the earlier suites (test_gift_engine.py, test_tau_control.py)
left open: the tau0 errors and their text, the round records and their event codes, the
checkpoint arrays, the option plumbing into the controllers, the weight rescaling of GIFT's
pools, AdaComm's read-out of the reduced scalars, and the ``/controller_events`` table.
"""

import types

import numpy as np
import pytest
import torch

from hpcfl.algorithms.gift import (
    AdaCommOptions,
    AdaCommSteps,
    GiftOptions,
    GiftSteps,
    TauSteps,
    events_table,
)
from hpcfl.errors import ConfigError


class _Scripted(TauSteps):
    """A TauSteps whose decisions are given in advance and which keeps the scalars it was handed."""

    def __init__(self, tau0, script):
        super().__init__(tau0, "scripted")
        self.script, self.seen = list(script), []

    def decide(self, ctx, seg, scalars):
        self.seen.append(scalars)
        return self.script.pop(0)


class _Res:
    """The part of a ClientResult that GiftSteps.pack reads: the flat update as a tensor."""

    def __init__(self, delta):
        self.delta = torch.as_tensor(np.asarray(delta, dtype=np.float64))


def _records(pol):
    """round_records without the float gift_C (NaN does not compare equal)."""
    return {k: v for k, v in pol.round_records(None).items() if k != "gift_C"}


# -- tau0 and its errors ------------------------------------------------------------------------

@pytest.mark.parametrize("make, what", [
    (lambda t: GiftSteps(GiftOptions(), t, 2, False), "gift"),
    (lambda t: AdaCommSteps(AdaCommOptions(), t, clock=False), "adacomm"),
])
def test_tau0_zero_is_refused_with_the_fix_and_tau0_one_is_accepted(make, what):
    """tau0 = 0 (local_steps unset) names the steps policy and the setting to change; tau0 = 1 is valid."""
    with pytest.raises(ConfigError, match=rf"^config error: algorithm\.steps = '{what}' starts from tau0 = algorithm\.local_steps; "
                                          r"set algorithm\.local_steps > 0 \(e\.g\. --set algorithm\.local_steps=100\)$"):
        make(0)
    assert make(1).tau == 1


# -- TauSteps: steps, control, receive, records, state -------------------------------------------

def test_steps_give_every_cohort_member_the_current_tau_as_int64():
    """steps() is one int64 tau per cohort member."""
    pol = _Scripted(6, [])
    s = pol.steps(types.SimpleNamespace(cohort=np.array([4, 9, 2])))
    assert s.dtype == np.int64 and s.tolist() == [6, 6, 6]


def test_records_before_any_round_show_tau0_and_no_iterations():
    """A fresh policy records tau_used = tau_next = tau0, no event and 0 local iterations."""
    assert _records(_Scripted(4, [])) == {"tau_used": 4, "tau_next": 4, "tau_event": 0, "local_iters_cum": 0}


def test_control_records_the_event_code_and_receive_sums_the_iterations():
    """control() passes the reduced scalars to decide() and records (used, next, event code); receive()
    adds the tau that just ran to local_iters_cum: 4 then 2 iterations give 4 and 6."""
    sc = {"weight": 1.0, "count": 1.0}
    pol = _Scripted(4, [(2, "stagnation"), (2, ""), (7, "afl")])
    assert pol.control(None, {}, sc) == 2 and pol.seen == [sc]
    assert _records(pol) == {"tau_used": 4, "tau_next": 2, "tau_event": 1, "local_iters_cum": 0}
    pol.receive(2)
    assert pol.control(None, {}, sc) == 2
    pol.receive(2)
    assert _records(pol) == {"tau_used": 2, "tau_next": 2, "tau_event": 0, "local_iters_cum": 6}
    pol.control(None, {}, sc)
    assert _records(pol)["tau_event"] == 6
    assert pol.tau == 2 and pol.iters == 6


def test_gift_control_reads_the_scalars_it_is_given():
    """GiftSteps.control hands the reduced scalars to decide: weight 0 means nobody reported, tau stays."""
    pol = GiftSteps(GiftOptions(), 4, 2, False)
    assert pol.control(None, {"delta": np.zeros(2), "gift_abs": np.zeros(2)}, {"weight": 0.0, "count": 0.0}) == 4


def test_base_state_is_tau_and_iterations_broadcast_as_tau_control():
    """Without controller scalars the checkpoint row is [tau, iters] in float64, named tau_control and
    broadcast to every rank; put() restores both."""
    pol = _Scripted(5, [])
    pol.receive(3)
    (item,) = pol.state()
    assert item.name == "tau_control" and item.broadcast is True
    v = item.get()
    assert v.dtype == np.float64 and v.tolist() == [3.0, 5.0]
    other = _Scripted(9, [])
    other.state()[0].set(v)
    assert (other.tau, other.iters) == (3, 5)


def test_gift_state_names_and_broadcast_flags():
    """GIFT checkpoints tau_control (broadcast) and gift_pools (rank 0 only)."""
    pol = GiftSteps(GiftOptions(), 4, 2, False)
    assert [(s.name, s.broadcast) for s in pol.state()] == [("tau_control", True), ("gift_pools", False)]
    assert [(s.name, s.broadcast) for s in AdaCommSteps(AdaCommOptions(), 4, clock=False).state()] == [
        ("tau_control", True)]


def test_gift_records_add_C_nan_before_the_first_round():
    """GiftSteps' records are the tau ones plus gift_C, NaN before any round."""
    rec = GiftSteps(GiftOptions(), 4, 2, False).round_records(None)
    assert sorted(rec) == ["gift_C", "local_iters_cum", "tau_event", "tau_next", "tau_used"]
    assert isinstance(rec["gift_C"], float) and np.isnan(rec["gift_C"])


# -- GiftOptions.validate --------------------------------------------------------------------------

@pytest.mark.parametrize("kw, msg", [
    ({"theta": 1.0}, "algorithm.gift.theta = 1.0 must be below 1 (0.9 in the paper)"),
    ({"theta": 1.5}, "algorithm.gift.theta = 1.5 must be below 1 (0.9 in the paper)"),
    ({"gamma": 1.0}, "algorithm.gift.gamma = 1.0 must exceed 1 (2 in the paper)"),
])
def test_validate_messages(kw, msg):
    """theta must be < 1 (1 itself refused) and gamma > 1 (1 itself refused), each with its exact message."""
    assert GiftOptions(**kw).validate() == [msg]
    assert GiftOptions(theta=0.99, gamma=1.01).validate() == []


# -- GiftSteps: options into the controller, pack, decide ------------------------------------------

def test_every_gift_option_reaches_the_controller():
    """Each [algorithm.gift] key, set away from its default, arrives in GiftController."""
    opts = GiftOptions(mode="literal", theta=0.5, gamma=3.0, reduce="l1", patience=3, warmup=2, eps_abs=0.01,
                       eps_rel=0.2, peak_guard=False, scale_patience=True, reset_ema=False, tau_min=2, relax=True,
                       delta=7, o=4, phase="always", tau_max=40)
    c = GiftSteps(opts, 8, 3, False).ctl
    got = (c.mode, c.ema.theta, c.gamma, c.ema.reduce, c.patience, c.warmup, c.eps_abs, c.eps_rel, c.peak_guard,
           c.scale_patience, c.reset_ema, c.tau_min, c.relaxation, c.delta, c.o, c.phase, c.tau_max, c.ema.size)
    assert got == ("literal", 0.5, 3.0, "l1", 3, 2, 0.01, 0.2, False, True, False, 2, True, 7, 4, "always", 40, 3)


def test_pack_weights_the_own_sum_and_the_absolute_values():
    """With own_sum, gift_sum = w u and gift_abs = w |u| over the P trainable entries (w = 0.5)."""
    out = GiftSteps(GiftOptions(), 4, 2, True).pack(None, 0, 0, _Res([2.0, -4.0, 9.0]), 0.5)
    assert out["gift_sum"].tolist() == [1.0, -2.0] and out["gift_abs"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("mode, pools", [("sum", [2.0, -1.0]), ("mean", [1.0, -0.5])])
def test_decide_rescales_the_sums_by_count_over_weight(mode, pools):
    """theta = 0, S = 2, A = 6 summed with weight 4 by 2 reporters: "sum" scales by n / sum w = 0.5
    (S = 1, A = 3: P~ = 2, N~ = -1), "mean" by 1 / sum w = 0.25 (P~ = 1, N~ = -0.5)."""
    pol = GiftSteps(GiftOptions(theta=0.0, pool_normalize=mode), 4, 1, False)
    pol.decide(None, {"delta": np.array([2.0, 55.0]), "gift_abs": np.array([6.0])}, {"weight": 4.0, "count": 2.0})
    assert pol.ctl.pools().tolist() == pools
    assert pol.C == pytest.approx(1.0 / 3.0, abs=1e-15)


def test_decide_reads_gift_sum_not_delta_when_it_packs_its_own():
    """own_sum: S comes from gift_sum (2), not from the delta segment (100): P~ = 2, N~ = -1 as above."""
    pol = GiftSteps(GiftOptions(theta=0.0), 4, 1, True)
    seg = {"delta": np.array([100.0]), "gift_sum": np.array([2.0]), "gift_abs": np.array([6.0])}
    pol.decide(None, seg, {"weight": 4.0, "count": 2.0})
    assert pol.ctl.pools().tolist() == [2.0, -1.0]


# -- AdaCommSteps ----------------------------------------------------------------------------------

def test_every_adacomm_option_reaches_the_controller():
    """interval_rounds, saturation_fix, tau_max and clock arrive in AdaCommController (and the defaults:
    saturation fix on, tau_max = tau0)."""
    c = AdaCommSteps(AdaCommOptions(interval_rounds=3, saturation_fix=False, tau_max=20), 10, clock=True).ctl
    assert (c.interval_rounds, c.fix, c.tau_max, c.clock) == (3, False, 20, True)
    c = AdaCommSteps(AdaCommOptions(), 10, clock=False).ctl
    assert (c.interval_rounds, c.fix, c.tau_max, c.clock) == (10, True, 10, False)


def _ada_rounds(pol, ctx, rounds):
    out = []
    for wl, w in rounds:
        tau, why = pol.decide(ctx, {}, {"weight_loss": wl, "weight": w})
        pol.receive(tau)
        out.append((tau, why))
    return out


def test_adacomm_without_clock_uses_the_weighted_mean_loss():
    """Every 3 rounds, no clock, plan None: F0 = 8 / 2 = 4; round 2 (nobody reported, weight 0) changes
    nothing; at round 3 F = 1 / 1 gives tau = ceil(sqrt(1/4) 16) = 8, reason "adacomm"."""
    pol = AdaCommSteps(AdaCommOptions(interval_rounds=3), 16, clock=False)
    ctx = types.SimpleNamespace(plan=None)
    assert _ada_rounds(pol, ctx, [(8.0, 2.0), (0.0, 0.0), (1.0, 1.0)]) == [(16, ""), (16, ""), (8, "adacomm")]


def test_adacomm_with_clock_reads_the_round_duration():
    """With the clock, T0 = 2 rounds x 1 s: round 2 ends at t = 2 s, a boundary, F = 1 gives tau = 8."""
    pol = AdaCommSteps(AdaCommOptions(interval_rounds=2), 16, clock=True)
    ctx = types.SimpleNamespace(plan=types.SimpleNamespace(duration_s=1.0))
    assert _ada_rounds(pol, ctx, [(8.0, 2.0), (1.0, 1.0)]) == [(16, ""), (8, "adacomm")]


def test_adacomm_state_round_trip_restores_the_controller():
    """The tau_control row of one AdaComm policy, loaded into a fresh one, continues the same schedule."""
    ctx = types.SimpleNamespace(plan=None)
    a = AdaCommSteps(AdaCommOptions(interval_rounds=2), 16, clock=False)
    b = AdaCommSteps(AdaCommOptions(interval_rounds=2), 16, clock=False)
    _ada_rounds(a, ctx, [(8.0, 2.0)])
    b.state()[0].set(np.array(a.state()[0].get(), copy=True))
    assert (b.ctl.F0, b.ctl.r, b.iters) == (4.0, 1, 16)
    assert _ada_rounds(b, ctx, [(1.0, 1.0)]) == [(8, "adacomm")]


# -- events_table ----------------------------------------------------------------------------------

def test_events_table_fields_and_unknown_codes():
    """The /controller_events columns are round, old_tau, new_tau, reason; a code without a name
    (here 9) gives an empty reason, and rows appear only where tau changed."""
    t = events_table([1, 2, 3], [8, 8, 4], [8, 4, 6], [0, 9, 3])
    assert t.dtype.names == ("round", "old_tau", "new_tau", "reason")
    assert t.tolist() == [(2, 8, 4, b""), (3, 4, 6, b"literal")]
