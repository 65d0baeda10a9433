"""Every paper job says what runs: each figure of the paper a job quotes (its ``[paper]`` table) sits
on a run whose settings are the paper's, or is labelled as shown beside hpcfl's own rule."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from hpcfl import config
from hpcfl.config import paper, paperjobs
from hpcfl.errors import ConfigError

PAPERS = Path(__file__).resolve().parents[2] / "jobs" / "papers"
JOBS = sorted(PAPERS.glob("*.toml"))
QUOTING = ("gift_table2_", "gift_fig5_lenet5", "fedlga_", "feddisco_", "fedgsnr_")   # families that quote figures


@pytest.mark.parametrize("job", JOBS, ids=[p.name for p in JOBS])
def test_every_quote_sits_on_a_valid_run_of_the_papers_policies_or_is_labelled(job):
    assert paperjobs.check_job(job) == []
    table = config.read_job(job)
    if job.name.startswith(QUOTING):
        assert len(table["paper"]["quote"]) >= 2, job.name


def test_the_families_count_of_quotes():
    count = {p.stem: len(config.read_job(p).get("paper", {}).get("quote", [])) for p in JOBS}
    assert count["gift_table2_lenet5"] == 4             # GIFT and FedAvg: accuracy and hours
    assert count["fedlga_fmnist_mlp"] == 6 + 3 + 4       # six methods, FedLGA at tau_max 3, 2, 1, and FedLGA's
    #                                                      four again on the paper-exact run
    assert count["feddisco_cifar10_niid1"] == 12 + 1 + 4  # six methods x (size, disco), Table 13, Table 7
    assert count["feddisco_cifar10_partial"] == 24       # accuracy and rounds for six methods x 2
    assert count["fedgsnr_table1_pareto"] == 12          # Tables 1 and 3, three methods x 2
    assert count["fedgsnr_table2_nonbalance100"] == 10


def test_gift_quotes_algorithm_1_and_never_the_stagnation_rule():
    table = config.read_job(PAPERS / "gift_table2_lenet5.toml")
    assert table["sweep"]["algorithm.gift.mode"] == ["literal", "stagnation", "fixed"]
    points = {q["point"]["algorithm.gift.mode"] for q in table["paper"]["quote"]}
    assert points == {"literal", "fixed"}
    assert table["paper"]["hpcfl_rules"] == {"algorithm.gift.mode": ["stagnation"]}


def test_a_quote_on_hpcfls_rule_is_refused():
    """The paper's GIFT figure attached to the stagnation group: refused, naming the rule."""
    text = (PAPERS / "gift_table2_lenet5.toml").read_text()
    bad = text.replace('point = { "algorithm.gift.mode" = "literal" }', 'point = { "algorithm.gift.mode" = "stagnation" }')
    assert bad != text
    problems = paperjobs.check_table(tomllib.loads(bad))
    assert len(problems) == 2   # accuracy and hours
    assert all("uses hpcfl's own rule algorithm.gift.mode = 'stagnation'" in p for p in problems)
    assert "Table II, LeNet-5, GIFT, final_accuracy 0.568" in problems[0]
    # labelled as hpcfl's, the same quotes pass
    labelled = bad.replace('metric = "final_accuracy"\nvalue = 0.568', 'metric = "final_accuracy"\nvalue = 0.568\n'
                           'rules = "hpcfl"').replace('value = 0.64\n', 'value = 0.64\nrules = "hpcfl"\n')
    assert paperjobs.check_table(tomllib.loads(labelled)) == []


def test_the_rule_is_found_through_the_defaults():
    """The Fig. 5 job without its [algorithm.gift] table runs gift.mode's default, hpcfl's stagnation
    rule: the quotes on the gift point are then refused."""
    table = config.read_job(PAPERS / "gift_fig5_lenet5.toml")
    assert paperjobs.check_table(table) == []
    del table["algorithm"]["gift"]
    problems = paperjobs.check_table(table)
    assert len(problems) == 2 and all("algorithm.gift.mode = 'stagnation'" in p for p in problems)


def test_a_hpcfl_label_on_the_papers_run_is_refused():
    text = (PAPERS / "gift_table2_lenet5.toml").read_text()
    bad = text.replace('value = 0.521\n', 'value = 0.521\nrules = "hpcfl"\n')
    problems = paperjobs.check_table(tomllib.loads(bad))
    assert len(problems) == 1 and "labelled rules = \"hpcfl\" but the run" in problems[0]


def test_a_quote_must_name_a_run_that_exists_and_validates():
    base = tomllib.loads((PAPERS / "fedlga_fmnist_mlp.toml").read_text())
    quotes = base["paper"]["quote"]
    quotes[1]["point"] = {"algorithm.name": "fedprox"}          # not a point of the grid
    quotes[2]["point"] = {"algorithm.lr": 0.1}                  # not a swept key
    quotes[3]["set"] = {"algorithm.mu": 1.0}                    # FedNova with mu: an invalid job
    problems = paperjobs.check_table(base)
    assert len(problems) == 3
    assert "point algorithm.name = 'fedprox' is not among the [sweep] values" in problems[0]
    assert "point key 'algorithm.lr' is not a [sweep] key" in problems[1]
    assert "is not a valid job: algorithm.mu = 1.0 is used only by local" in problems[2]


def test_the_reader_validates_the_paper_table_and_the_run_ignores_it():
    job = {"data": {"dataset": "digits"}, "model": {"name": "mlp"}}
    cfg = config.from_dict({**job, "paper": {"quote": [{"figure": "Table 1", "metric": "final_accuracy",
                                                        "value": 0.5}]}})
    assert cfg.to_dict() == config.from_dict(job).to_dict()   # not part of the run, nor of its digest
    with pytest.raises(ConfigError) as err:
        config.from_dict({**job, "paper": {"quote": [{"figure": "Table 1", "metric": "accuracy", "value": "high"},
                                                     {"figure": "Table 2", "metric": "rounds_to_target", "value": 9,
                                                      "rules": "mine"}],
                                           "hpcfl_rule": {}}})
    assert err.value.problems == [
        "paper.hpcfl_rule is not a key of [paper]; it takes hpcfl_rules and [[paper.quote]] tables",
        "paper.quote[0].metric = 'accuracy' is not one of " + ", ".join(paper.METRICS),
        "paper.quote[0].value = 'high' must be a number, or a bound such as \">1000\"",
        "paper.quote[1]: metric 'rounds_to_target' needs target (the test accuracy to reach, e.g. target = 0.6)",
        "paper.quote[1].rules = 'mine' must be \"paper\" (the run follows the paper) or \"hpcfl\" (the paper's "
        "figure beside a run of hpcfl's own rule)",
    ]


def test_fedlgas_figures_sit_on_the_paper_exact_run_as_well_as_beside_hpcfls_defaults():
    """Every FedLGA figure labelled as hpcfl's (the default C_pseudo / avg_update point) is quoted again, as the
    paper's, on the same point run with B_alg1, full_grad and no guard (alpha_min = -inf)."""
    exact = {"algorithm.lga.variant": "B_alg1", "algorithm.lga.grad_proxy": "full_grad",
             "algorithm.lga.alpha_min": -math.inf}
    for stem in ("fedlga_fmnist_mlp", "fedlga_cifar10_resnet", "fedlga_cifar100_resnet"):
        quotes = config.read_job(PAPERS / f"{stem}.toml")["paper"]["quote"]
        ours = [q for q in quotes if q.get("rules") == "hpcfl"]
        on_exact = [q for q in quotes if q["point"] == {"algorithm.name": "fedlga"} and q.get("rules", "paper") == "paper"]
        assert ours and len(on_exact) == len(ours), stem
        for q in on_exact:
            assert {k: v for k, v in config.flatten(q["set"]).items() if k in exact} == exact, (stem, q["figure"])
        assert sorted(q["value"] for q in on_exact) == sorted(q["value"] for q in ours)
        assert paperjobs.check_job(PAPERS / f"{stem}.toml") == []
