"""Job-file loading: strict keys, types, ranges, presets, overrides, error messages."""

import json

import pytest

from hpcfl import config
from hpcfl.config import notices
from hpcfl.errors import ConfigError

BASE = {
    "run": {"rounds": 3, "seed": 1},
    "data": {"dataset": "digits", "partition": "dirichlet", "num_clients": 20, "dirichlet": {"alpha": 0.5}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg", "lr": 0.05, "clients_per_round": 5},
}


def with_(path, value, base=BASE):
    d = json.loads(json.dumps(base))
    node = d
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = value
    return d


def problems(table):
    with pytest.raises(ConfigError) as info:
        config.from_dict(table)
    return info.value.problems


def test_valid_job_and_presets():
    cfg = config.from_dict(BASE)
    assert (cfg.algorithm.local, cfg.algorithm.weights, cfg.algorithm.server, cfg.algorithm.steps) == (
        "sgd", "size", "average", "epochs")
    assert cfg.partition_options.alpha == 0.5
    prox = config.from_dict(with_(["algorithm"], {"name": "fedprox", "mu": 0.01}))
    assert prox.algorithm.local == "prox" and prox.algorithm.mu == 0.01
    fixed = config.from_dict(with_(["algorithm", "local_steps"], 7))
    assert fixed.algorithm.steps == "fixed"


@pytest.mark.parametrize(
    "path,value,key,fix",
    [
        (["algorithm", "lr"], -0.1, "algorithm.lr", "greater than 0"),
        (["algorithm", "lr"], "fast", "algorithm.lr", "expected a number"),
        (["algorithm", "name"], "fedmagic", "algorithm.name", "choose one of"),
        (["algorithm", "clients_per_round"], 21, "algorithm.clients_per_round", "exceeds data.num_clients = 20"),
        (["data", "num_clients"], 0, "data.num_clients", "greater than 0"),
        (["run", "rounds"], 2.5, "run.rounds", "expected an integer"),
        (["run", "roundz"], 3, "run.roundz", "did you mean run.rounds?"),
        (["algorithm", "momentum"], 1.0, "algorithm.momentum", "less than 1"),
        (["runtime", "reduce"], "fast", "runtime.reduce", "'exact', 'float'"),
        (["data", "dirichlet", "alfa"], 1.0, "data.dirichlet.alfa", "valid keys here"),
        (["data", "cifar10"], {"x": 1}, "[data.cifar10]", "rename the table"),
        (["data", "dataset"], "imagenet9", "data.dataset", "digits"),
        (["model", "name"], "transformer", "model.name", "mlp"),
        (["algorithm", "mu"], 0.1, "algorithm.mu", "local = 'prox'"),
        (["extra"], {"a": 1}, "[extra]", "valid sections"),
    ],
)
def test_bad_value_names_key_and_fix(path, value, key, fix):
    msgs = problems(with_(path, value))
    assert len(msgs) == 1, msgs
    assert key in msgs[0] and fix in msgs[0], msgs[0]


def test_all_problems_reported_at_once():
    table = with_(["algorithm", "lr"], -1)
    table = with_(["run", "rounds"], 0, table)
    table = with_(["runtime", "device"], "tpu", table)
    msgs = problems(table)
    assert len(msgs) == 3
    text = str(ConfigError(msgs))
    assert "3 problems" in text and "algorithm.lr" in text and "run.rounds" in text and "runtime.device" in text


def test_overrides_parse_toml_values_and_plain_strings():
    t = config.apply_overrides(BASE, ["algorithm.lr=0.2", "model.mlp.hidden=[8, 4]", "data.root=/scratch/x y",
                                      "runtime.reduce=float"])
    assert t["algorithm"]["lr"] == 0.2
    assert t["model"]["mlp"]["hidden"] == [8, 4]
    assert t["data"]["root"] == "/scratch/x y"
    assert BASE["algorithm"]["lr"] == 0.05  # the input is not modified
    cfg = config.from_dict(t)
    assert cfg.model_options.hidden == (8, 4) and cfg.runtime.reduce == "float"
    with pytest.raises(ConfigError, match="section.key=value"):
        config.apply_overrides(BASE, ["algorithm.lr"])


def test_config_round_trips_through_json_and_digest_is_stable():
    cfg = config.from_dict(BASE)
    again = config.from_dict(json.loads(cfg.to_json()))
    assert again == cfg and again.digest() == cfg.digest()
    assert config.from_dict(with_(["algorithm", "lr"], 0.1)).digest() != cfg.digest()


def test_missing_and_invalid_job_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        config.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nrounds = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(bad)


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "", "has space", "-flag", "x" * 129])
def test_run_name_must_be_a_plain_name(name):
    (msg,) = problems(with_(["run", "name"], name))
    assert msg.startswith("run.name") and "plain name" in msg


def test_run_name_accepts_plain_names():
    for name in ("quickstart", "dir_a0.5-seed3", "_x", "R1"):
        assert config.from_dict(with_(["run", "name"], name)).run.name == name


def test_lr_milestone_rounds_validation_and_schedule():
    from hpcfl.algorithms import milestone_rounds, round_lr
    step = with_(["algorithm", "lr_schedule"], "step")
    assert problems(with_(["algorithm", "lr_milestone_rounds"], [3, 2], step)) == [
        "algorithm.lr_milestone_rounds = [3, 2] must be increasing"]
    assert "only with algorithm.lr_schedule = 'step'" in problems(with_(["algorithm", "lr_milestone_rounds"], [2]))[0]
    assert "algorithm.lr_milestone_rounds" in problems(with_(["algorithm", "lr_milestone_rounds"], [0], step))[0]
    cfg = config.from_dict(with_(["algorithm", "lr_milestone_rounds"], [1, 2], step))
    assert [round_lr(cfg.algorithm, r, 3) for r in range(3)] == pytest.approx([0.05, 0.005, 0.0005], rel=1e-12)
    # fractions: int(m * R) for R = 20 gives rounds 10 and 15
    assert milestone_rounds("step", (0.5, 0.75), None, 20) == (10, 15)
    assert milestone_rounds("constant", (0.5, 0.75), None, 20) == ()


def test_resume_changes_compares_the_resolved_lr_schedule():
    step = with_(["algorithm", "lr_schedule"], "step", with_(["run", "rounds"], 20))
    old = config.from_dict(step).to_dict()
    longer = with_(["run", "rounds"], 40, step)
    changed, problem = config.resume_changes(old, config.from_dict(longer))
    assert changed == ["run.rounds"]
    assert problem.startswith("the lr milestones would move from rounds [10, 15] to [20, 30]")
    assert "--set algorithm.lr_milestone_rounds=[10,15]" in problem
    kept = config.from_dict(with_(["algorithm", "lr_milestone_rounds"], [10, 15], longer))
    assert config.resume_changes(old, kept) == (["run.rounds"], None)
    # the same schedule given in rounds instead of fractions is no change at all
    same = config.from_dict(with_(["algorithm", "lr_milestone_rounds"], [10, 15], step))
    assert config.resume_changes(old, same) == ([], None)
    # a constant lr has no milestones to move
    flat = with_(["run", "rounds"], 20)
    assert config.resume_changes(config.from_dict(flat).to_dict(), config.from_dict(with_(["run", "rounds"], 40))) \
        == (["run.rounds"], None)
    # another gamma is another schedule: an ordinary changed key, no schedule message
    changed, problem = config.resume_changes(old, config.from_dict(with_(["algorithm", "lr_gamma"], 0.5, longer)))
    assert changed == ["algorithm.lr_gamma", "run.rounds"] and problem is None


def test_keys_added_by_a_newer_version_at_their_default_are_no_change():
    old = config.from_dict(BASE).to_dict()
    del old["checkpoint"]["every_minutes"]             # a job stored before the key existed
    assert config.resume_changes(old, config.from_dict(BASE)) == ([], None)
    changed, _ = config.resume_changes(old, config.from_dict(with_(["checkpoint", "every_minutes"], 5.0)))
    assert changed == ["checkpoint.every_minutes"]
    assert problems(with_(["checkpoint", "every_minutes"], -1.0))[0].startswith("checkpoint.every_minutes")


def test_every_problem_of_a_job_in_one_pass():
    """A typo in a component table, a cohort larger than the clients, a bad key in [data], a
    bad policy slot, a bad [runtime] value and a misnamed [model.*] key: all in the first
    report (the cohort check waits only when data.num_clients itself is refused)."""
    table = with_(["data", "dirichlet"], {"alpah": 0.5})
    table = with_(["algorithm", "clients_per_round"], 50, table)
    table = with_(["data", "shuffle"], True, table)
    table = with_(["algorithm", "steps"], "gsnrr", table)
    table = with_(["runtime", "threads"], -1, table)
    table = with_(["model", "mlp"], {"hiden": [8]}, table)
    msgs = problems(table)
    expected = ["data.dirichlet.alpah", "clients_per_round = 50 exceeds data.num_clients = 20", "data.shuffle",
                "algorithm.steps = 'gsnrr'", "runtime.threads = -1", "model.mlp.hiden"]
    assert len(msgs) == len(expected) and all(any(e in m for m in msgs) for e in expected), msgs
    msgs = problems(with_(["data", "num_clients"], "twenty", table))
    assert not any("exceeds" in m for m in msgs) and any("data.num_clients = 'twenty'" in m for m in msgs)


def test_cross_key_checks_run_beside_a_refused_key_unless_they_read_it():
    """algorithm.sampling needs clients_per_round > 0: reported together with a bad lr; but
    with clients_per_round itself refused, no check restates it against its default."""
    table = with_(["algorithm"], {"name": "fedavg", "lr": "fast", "sampling": "unbiased"})
    msgs = problems(table)
    assert len(msgs) == 2 and "algorithm.lr" in msgs[0] and "needs partial participation" in msgs[1], msgs
    msgs = problems(with_(["algorithm", "clients_per_round"], -3, table))
    assert len(msgs) == 2 and not any("partial participation" in m for m in msgs), msgs


@pytest.mark.parametrize("override,dropped,chosen", [
    ("data.partition=pareto", "data.dirichlet", lambda c: type(c.partition_options).__name__ == "ParetoOptions"),
    ("model.name=logreg", "model.mlp", lambda c: c.model.name == "logreg"),
    ("algorithm.name=fedavg", "algorithm.gsnr", lambda c: c.algorithm.steps == "fixed"),
    ("algorithm.steps=fixed", "algorithm.gsnr", lambda c: c.algorithm.steps == "fixed"),
])
def test_set_switching_a_component_drops_the_old_table_with_a_note(override, dropped, chosen):
    """Kept, the old component's table would be refused ("[data.dirichlet] is given but ...")."""
    base = with_(["model", "mlp"], {"hidden": [8]})
    base = with_(["algorithm"], {"name": "fedgsnr", "local_steps": 5, "gsnr": {"max_steps": 9}}, base)
    section, name = dropped.split(".")
    kept = config.apply_overrides(base, [override])
    kept[section][name] = base[section][name]
    assert any(f"[{dropped}] is given" in m for m in problems(kept))
    notes = []
    cfg = config.from_dict(config.apply_overrides(base, [override], notes))
    assert chosen(cfg) and notes == [f"[{dropped}] is left out: after --set {override} no chosen component reads it"]


def test_set_keeps_a_table_it_fills_and_tables_of_unchanged_choices():
    notes = []
    t = config.apply_overrides(BASE, ["data.partition=pareto", "data.pareto.shape=2.0", "algorithm.lr=0.1"], notes)
    assert t["data"]["pareto"] == {"shape": 2.0} and "dirichlet" not in t["data"] and len(notes) == 1
    notes = []
    t = config.apply_overrides(BASE, ["data.partition=dirichlet", "algorithm.name=fednova"], notes)
    assert t["data"]["dirichlet"] == {"alpha": 0.5} and notes == []


def test_job_file_without_data_or_model_is_refused_not_run_on_defaults(tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"has no \[data\] and no \[model\] table"):
        config.load(empty)
    only_run = tmp_path / "run.toml"
    only_run.write_text("[run]\nrounds = 2\n[data]\ndataset = 'digits'\n")
    with pytest.raises(ConfigError, match=r"has no \[model\] table"):
        config.load(only_run)
    assert config.load(only_run, ["model.name=logreg"]).model.name == "logreg"   # --set may supply it


def test_fedprox_runs_with_the_papers_mu_unless_the_job_gives_one():
    """FedDisco and FedGSNR compare with FedProx at mu = 0.01; a job's own mu wins, and a
    preset whose local solver is not prox gets none."""
    assert config.from_dict(with_(["algorithm", "name"], "fedprox")).algorithm.mu == 0.01
    assert config.from_dict(with_(["algorithm"], {"name": "custom", "local": "prox"})).algorithm.mu == 0.01
    assert config.from_dict(with_(["algorithm"], {"name": "fedprox", "mu": 0.5})).algorithm.mu == 0.5
    assert config.from_dict(with_(["algorithm"], {"name": "fedprox", "local": "scaffold"})).algorithm.mu == 0.0
    msgs = problems(with_(["algorithm"], {"name": "fedprox", "mu": 0.0}))
    assert len(msgs) == 1 and "e.g. mu = 0.01" in msgs[0]


def test_start_notes_name_the_lr_drop_rounds_and_a_fedlga_without_slow_clients():
    step = with_(["algorithm"], {"name": "fedavg", "lr_schedule": "step", "lr_milestones": [0.6, 0.9]},
                 with_(["run", "rounds"], 100))
    assert notices.start_notes(config.from_dict(step)) == [
        "the lr is multiplied by 0.1 after rounds 60, 90: algorithm.lr_milestones [0.6, 0.9] are fractions of "
        "run.rounds = 100 (algorithm.lr_milestone_rounds fixes them in rounds)"]
    step["algorithm"]["lr_milestone_rounds"] = [60, 90]
    assert notices.start_notes(config.from_dict(step)) == []
    (lga,) = notices.start_notes(config.from_dict(with_(["algorithm", "name"], "fedlga")))
    assert "it runs as FedAvg with uniform weights" in lga and "steps = 'straggler'" in lga
    assert notices.start_notes(config.from_dict(with_(["algorithm"], {"name": "fedlga", "steps": "straggler"}))) == []


def test_describe_changes_gives_the_stored_and_the_new_value():
    old = config.from_dict(BASE).to_dict()
    new = config.from_dict(with_(["runtime", "threads"], 1, with_(["run", "rounds"], 12)))
    assert notices.describe_changes(old, new, ["run.rounds", "runtime.threads"]) == \
        "run.rounds 3 -> 12, runtime.threads 0 -> 1"
@pytest.mark.parametrize("path,value,words", [
    (["algorithm", "lr"], 1e308, "algorithm.lr = 1e+308 is too large: at most 1e+30"),
    (["algorithm", "lr"], float("inf"), "algorithm.lr = inf must be finite"),
    (["algorithm", "lr"], float("nan"), "algorithm.lr = nan is not a number"),
    (["run", "seed"], 2**64, "run.seed = 18446744073709551616 does not fit a 64-bit integer"),
    (["algorithm", "batch_size"], 2**63, "algorithm.batch_size = 9223372036854775808 does not fit"),
    (["system", "compute_s"], float("inf"), "system.compute_s = inf must be finite"),
])
def test_values_no_run_can_use_are_refused(path, value, words):
    """These failed with tracebacks (exit 1), seed = 2**64 after creating results.h5."""
    msgs = problems(with_(path, value))
    assert any(words in m for m in msgs), msgs
    assert config.from_dict(with_(["system", "uplink_mbps"], float("inf"))).system.uplink_mbps == float("inf")


def test_job_files_that_are_not_utf8_or_nest_too_deeply(tmp_path):
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[run]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin.toml' is not UTF-8 text \(byte 17"):
        config.load(latin)
    deep = tmp_path / "deep.toml"
    deep.write_text("[run]\nx = " + "[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(ConfigError, match="nests arrays or tables too deeply"):
        config.load(deep)
    with pytest.raises(ConfigError, match="nests arrays too deeply"):
        config.apply_overrides(BASE, ["model.mlp.hidden=" + "[" * 100000 + "]" * 100000])
