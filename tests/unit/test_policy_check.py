"""One method per policy duty: a policy whose method the engine would never call is refused where it
is registered (building an Algorithm, or Algorithm.add), naming the method the engine does call."""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from runner import job

from hpcfl import config
from hpcfl.algorithms import Algorithm, registry
from hpcfl.algorithms.policies import FixedSteps
from hpcfl.algorithms.protocol import Policy, ServerRule, check_policy
from hpcfl.algorithms.server import AverageRule
from hpcfl.client.trainer import ClientResult
from hpcfl.parallel.comm import ExactSum

D = torch.float64


def build(**keys):
    cfg = config.from_dict(job(**{"runtime.dtype": "float64", **keys}))
    return Algorithm(cfg, 3, 3, 2, torch.device("cpu"), D, np.full(2, 10, dtype=np.int64))


def with_server_rule(monkeypatch, rule_class):
    monkeypatch.setitem(registry.SERVER, "average", lambda b: rule_class(b.num_params))


class ContributionRule(AverageRule):
    """The extension guide's old name: contribution() instead of contribute_into()."""

    def contribution(self, delta, weight, anorm):
        return np.asarray(delta) * weight * 2


class PlainPolicyRule(Policy):
    """A server rule that is not a ServerRule: the engine would find no contribute_into()."""

    def aggregate(self, delta_sum, s, seg=None):
        return delta_sum / s["weight"]


class NoAggregateRule(ServerRule):
    pass


class StepsWithAggregate(FixedSteps):
    """A steps policy that defines a server rule's duty: it would never be called there."""

    def aggregate(self, delta_sum, s, seg=None):
        return delta_sum


def test_a_rule_overriding_contribution_is_refused_at_registration(monkeypatch):
    with_server_rule(monkeypatch, ContributionRule)
    with pytest.raises(TypeError, match=r"ContributionRule defines contribution\(\), which the engine never calls.*"
                                        r"contribute_into\(out, weight, anorm\)"):
        build()


def test_a_server_rule_must_derive_from_server_rule_and_aggregate(monkeypatch):
    with_server_rule(monkeypatch, lambda n: PlainPolicyRule())
    with pytest.raises(TypeError, match="PlainPolicyRule is a server rule but does not derive from .*ServerRule"):
        build()
    with_server_rule(monkeypatch, lambda n: NoAggregateRule())
    with pytest.raises(TypeError, match=r"NoAggregateRule is a server rule but does not define aggregate"):
        build()


def test_a_server_duty_outside_the_server_slot_is_refused(monkeypatch):
    monkeypatch.setitem(registry.STEPS, "fixed", lambda b: StepsWithAggregate(2))
    with pytest.raises(TypeError, match=r"StepsWithAggregate \(steps\) defines aggregate\(\), which the engine calls "
                                        r"only on the server rule"):
        build(**{"algorithm.local_steps": 2})


def test_an_added_policy_is_checked_too():
    algo = build()
    with pytest.raises(TypeError, match="ContributionRule defines contribution"):
        algo.add(ContributionRule(3))
    with pytest.raises(TypeError, match="does not derive from hpcfl.algorithms.protocol.Policy"):
        algo.add(object())
    algo.add(Policy())   # a plain add-on with no hooks is fine


@pytest.mark.parametrize("preset", sorted(registry.PRESETS))
def test_every_preset_passes_the_check(preset):
    """Every shipped combination registers (the check refuses none of hpcfl's own policies)."""
    algo = build(**{"algorithm.name": preset})
    check_policy(algo.rule, "server")
    for p in algo.policies:
        check_policy(p, "server" if p is algo.rule else "any")


class HalfRule(AverageRule):
    """Contributes half of w_i Delta_i: if the engine calls contribute_into, the update halves."""

    def contribute_into(self, out, weight, anorm):
        out *= weight / 2
        return out


def test_contribute_into_is_the_method_the_engine_calls(monkeypatch):
    """Two clients, updates (2, 4, 6) and (4, 0, 2), weights 1 and 3, x = 0: FedAvg gives
    (1*(2,4,6) + 3*(4,0,2)) / 4 = (3.5, 1, 3); HalfRule's contributions halve the sum: (1.75, 0.5, 1.5)."""
    deltas, weights = [[2.0, 4.0, 6.0], [4.0, 0.0, 2.0]], [1.0, 3.0]

    def one_round():
        algo = build(**{"algorithm.local_steps": 1})
        ctx = type("Ctx", (), {"lr": algo.lr})()
        acc = ExactSum(algo.layout.length)
        for slot, (d, w) in enumerate(zip(deltas, weights)):
            acc.add(algo.pack(ctx, slot, slot, ClientResult(torch.tensor(d, dtype=D), 1, 1.0, 0.0, 8), w))
        new_x, _ = algo.server_step(ctx, np.zeros(3), acc.reduce(MPI.COMM_SELF, total=2))
        return new_x.tolist()

    assert one_round() == [3.5, 1.0, 3.0]
    with_server_rule(monkeypatch, HalfRule)
    assert one_round() == [1.75, 0.5, 1.5]
