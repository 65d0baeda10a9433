"""Legend words declared beside the registry entries, and the registration function's checks."""

import pytest

from hpcfl.algorithms import policies, registry
from hpcfl.analysis import words


def test_legend_words_are_the_registry_entries():
    assert words.PRESETS is registry.LABELS
    assert words.key_words("algorithm.name", {"algorithm.name": "feddisco"}) == "FedDisco"
    assert words.key_words("algorithm.weights", {"algorithm.weights": "disco"}) == "FedDisco weights"
    assert set(registry.LABELS) == set(registry.PRESETS)
    for slot, table in registry.SLOTS.items():   # every policy has its words (random_epochs: E ~ U{..})
        assert set(table) - {"random_epochs"} <= set(registry.SLOT_LABELS[slot]), slot


def test_an_option_of_a_policy_the_run_does_not_use_says_nothing():
    """A FedAvg group beside FedDisco ones reads "FedAvg", not "FedAvg, a unset"."""
    keys = ["algorithm.name", "algorithm.disco.a"]
    fedavg = {"algorithm.name": "fedavg", "algorithm.weights": "size"}
    disco = {"algorithm.name": "feddisco", "algorithm.weights": "disco", "algorithm.disco.a": 0.5}
    assert words.group_words(keys, fedavg) == "FedAvg"
    assert words.group_words(keys, disco) == "FedDisco, a = 0.5"
    # an option of the policy the run does use, left unset, is still said
    assert words.group_words(keys, {**disco, "algorithm.disco.a": None}) == "FedDisco, a unset"


def test_register_adds_a_policy_with_its_words_and_refuses_a_taken_name():
    try:
        registry.register("weights", "h8_probe", lambda b: policies.UniformWeights(), label="probe weights")
        registry.register_preset("h8_probe_preset", {"weights": "h8_probe"}, label="Probe")
        assert "h8_probe" in registry.WEIGHTS
        assert words.group_words(["algorithm.name", "algorithm.weights"],
                                 {"algorithm.name": "h8_probe_preset", "algorithm.weights": "h8_probe"}) == \
            "Probe, probe weights"
        with pytest.raises(ValueError, match="'h8_probe' is already registered"):
            registry.register("weights", "h8_probe", lambda b: None)
    finally:
        registry.WEIGHTS.pop("h8_probe", None)
        registry.SLOT_LABELS["weights"].pop("h8_probe", None)
        registry.PRESETS.pop("h8_probe_preset", None)
        registry.LABELS.pop("h8_probe_preset", None)
    with pytest.raises(ValueError, match="'size' is already registered"):
        registry.register("weights", "size", lambda b: None)
    with pytest.raises(ValueError, match="slot 'weight' is not one of local, steps, weights, server"):
        registry.register("weight", "x", lambda b: None)
    with pytest.raises(ValueError, match="weights = 'nope' is not a registered policy"):
        registry.register_preset("x", {"weights": "nope"})
