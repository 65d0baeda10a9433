"""RowTable's own and guest rows through every entry (``[]``, ``reserve``, the ClientTable it gives a
checkpoint and balanced placement), the server rule's default tau_eff, and check_policy's messages.

Each test pins a value or an error a caller meets; the mutation run (docs/testing.md) is what showed
them missing.
"""

import re

import numpy as np
import pytest
import torch

from hpcfl.algorithms.protocol import Policy, RowTable, ServerRule, check_policy

D = torch.float64


def table(home=3):
    """A table whose own row s holds (10 s, 10 s + 10): every row tells where it came from."""
    t = RowTable(home, 2, torch.device("cpu"), D)
    t.client_table("x").set(np.array([[10.0 * s, 10.0 * s + 10] for s in range(home)]))
    return t


# ---- RowTable: slots, guests, reserve


def test_a_fresh_table_is_zero_with_no_guests_and_refuses_a_guest_slot():
    t = RowTable(3, 2, torch.device("cpu"), D)
    assert t.guests == 0
    assert t.tensor().shape == (3, 2) and t.tensor().dtype == D
    assert torch.equal(t[2], torch.zeros(2, dtype=D))
    with pytest.raises(IndexError, match=r"^guest slot 3 beyond the 0 reserved$"):
        t[3]


def test_guest_slots_start_at_home_and_end_at_the_reserved_count():
    t = table()
    t.reserve(2)
    assert t.guests == 2 and t._g.shape == (2, 2) and t._g.dtype == D
    t[3] = torch.tensor([7.0, 8.0], dtype=D)        # the first guest slot is `home`, not an own row
    t[4] = torch.tensor([9.0, 1.0], dtype=D)
    assert t[3].tolist() == [7.0, 8.0] and t[4].tolist() == [9.0, 1.0]
    assert t[2].tolist() == [20.0, 30.0]            # own rows untouched
    with pytest.raises(IndexError, match=r"^guest slot 5 beyond the 2 reserved$"):
        t[5]


def test_reserve_never_shrinks_or_clears_guests_and_never_touches_own_rows():
    t = table()
    own = t.tensor()
    t.reserve(2)
    t[4] = torch.tensor([9.0, 1.0], dtype=D)
    t.reserve(2)                                    # no more room needed: the guest rows stay
    t.reserve(1)
    assert t.guests == 2 and t[4].tolist() == [9.0, 1.0]
    assert t.tensor() is own and t[1].tolist() == [10.0, 20.0]


def test_rows_live_on_the_table_device():
    """The meta device allocates nothing: it shows where a tensor would be, as on a GPU."""
    t = RowTable(2, 3, torch.device("meta"), D)
    assert t.tensor().device.type == "meta"
    t.reserve(1)
    assert t._g.device.type == "meta" and t._g.shape == (1, 3)


# ---- RowTable.client_table: what checkpoints and balanced placement use


def test_client_table_get_set_and_its_fields():
    t = RowTable(3, 2, torch.device("cpu"), D)
    ct = t.client_table("rows")
    assert (ct.name, ct.width, ct.movable) == ("rows", 2, True)
    ct.set(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    assert ct.get().tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    ct.reserve(2)
    assert t.guests == 2


@pytest.mark.parametrize("slots, expect", [
    ([2, 0], [[20.0, 30.0], [0.0, 10.0]]),                       # own only, out of order
    ([3, 4], [[7.0, 8.0], [9.0, 1.0]]),                          # guests only
    ([4, 1, 3], [[9.0, 1.0], [10.0, 20.0], [7.0, 8.0]]),         # mixed
])
def test_rows_reads_own_and_guest_rows_in_the_order_asked(slots, expect):
    t = table()
    t.reserve(2)
    t[3], t[4] = torch.tensor([7.0, 8.0], dtype=D), torch.tensor([9.0, 1.0], dtype=D)
    out = t.client_table("x").rows(np.array(slots))
    assert out.dtype == np.float64 and out.shape == (len(slots), 2)
    assert out.tolist() == expect


@pytest.mark.parametrize("slots", [[0, 1], [1, 2], [2, 0], [0, 2], [3, 4], [4, 3], [3], [4, 0, 3, 2]])
def test_put_writes_exactly_the_rows_named(slots):
    """Runs of own rows (a resume's block), scattered own rows, guests, and mixes."""
    t = table()
    t.reserve(2)
    before = {s: t[s].tolist() for s in range(5)}
    values = np.array([[100.0 + s, -1.0 - s] for s in slots])
    t.client_table("x").put(np.array(slots), values)
    for s in range(5):
        assert t[s].tolist() == ([100.0 + s, -1.0 - s] if s in slots else before[s]), s


def test_put_then_rows_round_trip_a_float32_table():
    t = RowTable(2, 3, torch.device("cpu"), torch.float32)
    ct = t.client_table("x")
    ct.reserve(1)
    ct.put(np.array([2, 0]), np.array([[1.5, 2.5, 3.5], [4.0, 5.0, 6.0]], dtype=np.float32))
    out = ct.rows(np.array([0, 1, 2]))
    assert out.dtype == np.float32
    assert out.tolist() == [[4.0, 5.0, 6.0], [0.0, 0.0, 0.0], [1.5, 2.5, 3.5]]


# ---- ServerRule.tau_eff and check_policy


def test_the_default_tau_eff_is_the_weighted_mean_of_anorm():
    assert ServerRule().tau_eff({"weight_anorm": 6.0, "weight": 2.0}) == 3.0


class Contribution(Policy):
    def contribution(self, delta, weight, anorm):
        return delta


class Plain(Policy):
    def aggregate(self, delta_sum, s, seg=None):
        return delta_sum


class NoAggregate(ServerRule):
    pass


class Misplaced(Policy):
    def aggregate(self, delta_sum, s, seg=None):
        return delta_sum

    def tau_eff(self, s):
        return 1.0


@pytest.mark.parametrize("policy, slot, message", [
    (object(), "local", ("object (local) does not derive from hpcfl.algorithms.protocol.Policy: the engine calls "
                         "only the hooks that class declares")),
    (Contribution(), "add-on", ("Contribution defines contribution(), which the engine never calls: a server rule "
                                "turns a client's update into its contribution in contribute_into(out, weight, "
                                "anorm), in place (hpcfl.algorithms.protocol.ServerRule)")),
    (Plain(), "server", ("Plain is a server rule but does not derive from hpcfl.algorithms.protocol.ServerRule "
                         "(contribute_into, aggregate, tau_eff)")),
    (NoAggregate(), "server", "NoAggregate is a server rule but does not define aggregate(delta_sum, s, seg)"),
    (Misplaced(), "steps", ("Misplaced (steps) defines aggregate(), tau_eff(), which the engine calls only on the "
                            "server rule; move it into the job's server rule (algorithm.server)")),
])
def test_check_policy_names_the_class_the_method_and_the_fix(policy, slot, message):
    with pytest.raises(TypeError, match="^" + re.escape(message) + "$"):
        check_policy(policy, slot)


def test_check_policy_accepts_a_plain_add_on_and_a_complete_rule():
    class Rule(ServerRule):
        def aggregate(self, delta_sum, s, seg=None):
            return delta_sum

    check_policy(Policy(), "add-on")
    check_policy(Rule(), "server")
