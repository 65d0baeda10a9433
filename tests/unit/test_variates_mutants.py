"""The control variates' state as a checkpoint and the broadcast see it (names, broadcast flags, what a
restore copies and converts), where their tensors live, and the messages of VR's two refusals."""

import re

import numpy as np
import pytest
import torch

from hpcfl.algorithms.server import ServerOptimizer
from hpcfl.algorithms.variates import Scaffold, VarianceReduction, server_momentum_state

D = torch.float64
CPU = torch.device("cpu")


class Ctx:
    def __init__(self, cohort, weights):
        self.cohort, self.weights = np.array(cohort), np.array(weights)


@pytest.mark.parametrize("cls", [Scaffold, VarianceReduction])
def test_rows_and_c_live_on_the_policy_device(cls):
    """The meta device allocates nothing: it shows where a tensor would be, as on a GPU."""
    v = cls(2, 3, torch.device("meta"), D, num_clients=2)
    assert v.c.device.type == "meta" and v.c.shape == (3,)
    assert v._rows.tensor().device.type == "meta" and v._rows.tensor().shape == (2, 3)


def test_scaffold_state_is_its_rows_and_a_broadcast_c():
    s = Scaffold(2, 3, CPU, D, num_clients=4)
    table, c = s.state()
    assert (table.name, table.width, table.movable) == ("scaffold_c_i", 3, True)
    assert (c.name, c.broadcast) == ("scaffold_c", True)
    c.set(np.array([1.0, 2.0, 3.0]))
    assert s.c.tolist() == [1.0, 2.0, 3.0] and c.get().tolist() == [1.0, 2.0, 3.0]


def test_vr_state_restores_hbar_as_its_own_float64_copy_and_c_with_it():
    vr = VarianceReduction(2, 3, CPU, torch.float32, num_clients=2)
    table, hbar = vr.state()
    assert (table.name, hbar.name, hbar.broadcast) == ("vr_h_i", "vr_hbar", True)
    value = np.array([0.5, -1.0, 0.25], dtype=np.float32)
    hbar.set(value)
    value[:] = 7.0                                # the caller's buffer is not kept
    assert vr.hbar.dtype == np.float64 and vr.hbar.tolist() == [0.5, -1.0, 0.25]
    assert vr.c.dtype == torch.float32 and vr.c.tolist() == [0.5, -1.0, 0.25]
    assert hbar.get() is vr.hbar
    value = np.array([2.0, 4.0, 8.0])             # float64: no conversion that would copy anyway
    hbar.set(value)
    value[:] = 7.0
    assert vr.hbar.tolist() == [2.0, 4.0, 8.0] and vr.c.tolist() == [2.0, 4.0, 8.0]


def test_server_momentum_state_restores_a_copy():
    opt = ServerOptimizer(1.0, 0.9)
    state = server_momentum_state(opt)
    assert (state.name, state.broadcast, state.get()) == ("server_momentum", False, None)
    value = np.array([1.0, 2.0])
    state.set(value)
    value[:] = 0.0
    assert opt.buf.tolist() == [1.0, 2.0] and state.get() is opt.buf


def test_vr_refusals_name_the_fix():
    vr = VarianceReduction(3, 2, CPU, D, num_clients=3)
    vr.statistics(Ctx([0, 1, 2], [1.0, 2.0, 3.0]))
    with pytest.raises(RuntimeError, match="^" + re.escape(
            "local = 'vr' keeps hbar as a running weighted mean, which needs weights that do not change between "
            "rounds; use algorithm.weights = 'size' or 'uniform'") + "$"):
        vr.statistics(Ctx([0, 1, 2], [1.0, 2.0, 4.0]))


def test_variates_made_without_a_client_count_know_of_no_client():
    """num_clients defaults to 0 (unknown): VR then refuses any cohort rather than guess the total."""
    assert Scaffold(2, 3, CPU, D).num_clients == 0
    with pytest.raises(RuntimeError, match="^" + re.escape(
            "local = 'vr' needs every client in every round, got a cohort of 2 of 0; "
            "set algorithm.clients_per_round = 0") + "$"):
        VarianceReduction(2, 3, CPU, D).statistics(Ctx([0, 1], [1.0, 1.0]))
