"""Cohort sampling (hpcfl/algorithms/sampling.py): the with-replacement schemes, their alias and their
refusals. FedNova's T13 (every scheme unbiased, Monte Carlo) is in test_fednova.py.

``with_replacement`` trains every draw as its own instance with weight 1/q (FedNova App. G; Li et
al., ICLR 2020, scheme I); ``with_replacement_draws`` is its old name, kept as an alias;
``with_replacement_merged`` trains a client drawn k times once, with weight k/q.
"""

import dataclasses

import numpy as np
import pytest
from mpi4py import MPI
from runner import job, run_memory

from hpcfl import config
from hpcfl.algorithms.sampling import Sampler
from hpcfl.errors import ConfigError
from hpcfl.config.sections import AlgorithmSection

STATIC = np.array([1.0, 2.0, 3.0, 4.0])   # sampling probabilities p = (0.1, 0.2, 0.3, 0.4)


def test_per_draw_and_merged_schemes_share_their_draws():
    """200 rounds of q = 6 draws from p = (0.1, 0.2, 0.3, 0.4). ``with_replacement`` lists every draw
    (sorted, q entries, weight 1/q each); ``with_replacement_merged`` lists each drawn client once with
    weight k/q, k its number of draws in the same round; the alias gives the per-draw cohorts. Both
    schemes read the same keyed draws, so the merged cohort is the per-draw one without repeats.
    Rounds with a repeat are certain here (6 draws from 4 clients)."""
    q = 6
    draws, merged, alias = (Sampler(s, q, 5, STATIC) for s in
                            ("with_replacement", "with_replacement_merged", "with_replacement_draws"))
    for rnd in range(200):
        cohort, none = draws.cohort(rnd)
        assert none is None and len(cohort) == q and np.all(np.diff(cohort) >= 0)
        assert draws.weights(None, cohort, None).tolist() == [1 / q] * q
        ids, counts = merged.cohort(rnd)
        ids_ref, counts_ref = np.unique(cohort, return_counts=True)
        assert ids.tolist() == ids_ref.tolist() and counts.tolist() == counts_ref.tolist()
        assert merged.weights(None, ids, counts).tolist() == (counts_ref / q).tolist()
        again, _ = alias.cohort(rnd)
        assert again.tolist() == cohort.tolist()


def test_per_draw_sampling_refuses_per_client_state_naming_the_merged_scheme():
    """A client drawn twice would be two instances of one state: SCAFFOLD, FedDyn and FedGSNR's
    statistics are refused under ``with_replacement`` and its alias, each message naming the value
    given and ``with_replacement_merged`` as the fix; the merged scheme accepts SCAFFOLD. The help
    line of the key says that the old name is an alias."""
    cases = [{"algorithm.name": "scaffold"}, {"algorithm.name": "feddyn"},
             {"algorithm.steps": "gsnr", "algorithm.local_steps": 4}]
    for scheme in ("with_replacement", "with_replacement_draws"):
        for case in cases:
            with pytest.raises(ConfigError) as info:
                config.from_dict(job(**case, **{"algorithm.sampling": scheme}))
            text = str(info.value)
            assert f"algorithm.sampling = '{scheme}' trains a client drawn twice" in text
            assert "use sampling = 'with_replacement_merged'" in text
    ok = config.from_dict(job(**{"algorithm.name": "scaffold", "algorithm.sampling": "with_replacement_merged"}))
    assert ok.algorithm.sampling == "with_replacement_merged"
    help_text = {f.name: f.metadata["help"] for f in dataclasses.fields(AlgorithmSection)}["sampling"]
    assert "with_replacement_draws is an alias" in help_text


def test_alias_runs_bitwise_and_merged_trains_a_repeat_once():
    """SMALL (7 clients, 5 draws a round, 3 rounds), float64. The alias ``with_replacement_draws``
    gives bitwise the model and records of ``with_replacement``. SCAFFOLD under
    ``with_replacement_merged`` sees the same draws: its cohort is the per-draw cohort without
    repeats, with recorded weight k/5 (the k/q weights sum to 1), while the per-draw run records 1/5
    per draw; at least one round draws a client twice."""
    f64 = {"runtime.dtype": "float64"}
    x, m, c = run_memory(job(**f64, **{"algorithm.sampling": "with_replacement"}), MPI.COMM_SELF)
    xa, ma, ca = run_memory(job(**f64, **{"algorithm.sampling": "with_replacement_draws"}), MPI.COMM_SELF)
    assert x.tobytes() == xa.tobytes() and repr(m) == repr(ma)    # repr: NaN metrics compare equal
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(c, ca) for k in a)
    _, _, cm = run_memory(job(**f64, **{"algorithm.name": "scaffold",
                                        "algorithm.sampling": "with_replacement_merged"}), MPI.COMM_SELF)
    repeats = 0
    for per_draw, merged in zip(c, cm):
        ids, counts = np.unique(per_draw["client"], return_counts=True)
        assert np.allclose(per_draw["weight"], 0.2, rtol=0, atol=1e-15)
        assert merged["client"].tolist() == ids.tolist()
        assert np.allclose(merged["weight"], counts / 5, rtol=0, atol=1e-15)
        repeats += int((counts > 1).sum())
    assert repeats > 0


@pytest.mark.parametrize("scheme", ["with_replacement", "with_replacement_merged"])
def test_with_replacement_draws_are_numpys_choice_from_a_cdf_computed_once(scheme):
    """The cohort draws reuse one cumulative sum instead of Generator.choice(p=...) recomputing it
    over all N clients in every round: the draws must stay choice's own, bitwise."""
    from hpcfl import rng

    w = np.random.default_rng(3).random(5000) + 0.01
    s = Sampler(scheme, 37, 11, w)
    for rnd in range(25):
        want = rng.numpy_rng(11, rng.COHORT, rnd).choice(5000, size=37, replace=True, p=w / w.sum())
        cohort, draws = s.cohort(rnd)
        if scheme == "with_replacement":
            assert cohort.tolist() == sorted(want.tolist())
        else:
            ids, counts = np.unique(want, return_counts=True)
            assert cohort.tolist() == ids.tolist() and draws.tolist() == counts.tolist()
