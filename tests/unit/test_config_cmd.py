"""``hpcfl config``: help on every key, the resolved job as TOML that reads back unchanged, ``--defaults``."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from hpcfl import cli, config, data, models
from hpcfl.cli import config_cmd
from hpcfl.algorithms import registry
from hpcfl.errors import ConfigError
from hpcfl.system import SystemOptions

ROOT = Path(__file__).resolve().parents[2]
JOBS = sorted((ROOT / "jobs").glob("*.toml")) + sorted((ROOT / "jobs" / "papers").glob("*.toml"))


def run_config(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(["config", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def option_classes() -> dict[str, type]:
    """Every option dataclass a job can reach, walked from the registries (not from config_cmd)."""
    found = {name: cls for name, cls in (
        ("run", config.RunSection), ("data", config.DataSection), ("model", config.ModelSection),
        ("algorithm", config.AlgorithmSection), ("runtime", config.RuntimeSection), ("system", SystemOptions),
        ("checkpoint", config.CheckpointSection), ("guard", config.GuardSection),
        ("watchdog", config.WatchdogSection), ("results", config.ResultsSection))}
    found.update({f"data.{n}": s.options for n, s in data.DATASETS.items()})
    found.update({f"data.{n}": s.options for n, s in data.PARTITIONS.items()})
    found.update({f"model.{n}": s.options for n, s in models.MODELS.items()})
    found.update({f"algorithm.{n}": cls for n, cls in registry.OPTIONS.items()})
    return found


def test_every_key_has_one_line_help():
    classes = option_classes()
    assert len(classes) >= 10 + 11 + 11 + 10 + 5   # sections, datasets, partitions, models, policy tables
    missing, multiline = [], []
    for table, cls in classes.items():
        for f in dataclasses.fields(cls):
            text = f.metadata.get("help")
            if not isinstance(text, str) or not text.strip():
                missing.append(f"{table}.{f.name} ({cls.__name__})")
            elif "\n" in text:
                multiline.append(f"{table}.{f.name}")
    assert missing == [], f"keys without metadata help: {missing}"
    assert multiline == []


def test_help_keeps_the_constraints():
    lr = {f.name: f for f in dataclasses.fields(config.AlgorithmSection)}["lr"]
    assert dict(lr.metadata) == {"gt": 0, "help": "client learning rate of the local SGD steps (before any lr "
                                                  "schedule)"}
    assert config.AlgorithmSection().lr == 0.05
    with pytest.raises(ConfigError, match="algorithm.lr = -1.0 must be greater than 0"):
        config.from_dict({"algorithm": {"lr": -1}})


@pytest.mark.parametrize("job", JOBS, ids=[p.name for p in JOBS])
def test_printed_job_reads_back_as_the_same_config(capsys, job):
    table = config.read_job(job)
    sweep = table.pop("sweep", None)
    want = config.from_dict(table)
    rc, out, err = run_config(capsys, str(job))
    assert rc == 0, err
    back = tomllib.loads(out)
    assert back.pop("sweep", None) == sweep   # printed back unchanged, or absent as in the file
    got = config.from_dict(back)
    assert got.to_dict() == want.to_dict()
    assert got.digest() == want.digest()


def test_printed_job_has_every_default_and_help_before_each_key(capsys):
    rc, out, _ = run_config(capsys, str(ROOT / "jobs" / "quickstart.toml"))
    assert rc == 0
    lines = out.splitlines()
    i = lines.index("lr = 0.05")
    assert lines[i - 1] == "# client learning rate of the local SGD steps (before any lr schedule)"
    j = lines.index('sampling = "uniform"')
    assert lines[j - 1].endswith(
        "[uniform | with_replacement | with_replacement_merged | with_replacement_draws | unbiased]")
    assert "# root = (unset)" in lines                  # None: commented out, the help above it
    assert "downlink_mbps = inf" in lines               # a [system] default the job never mentions
    assert "[data.dirichlet]  # partition: class-wise Dirichlet (NIID-Bench noniid-labeldir, FedNova, FedDisco " \
           "NIID-1)" in lines
    back = tomllib.loads(out)
    assert back["data"]["dirichlet"] == {"alpha": 0.5, "min_samples": 10, "max_tries": 1000, "legacy_rng": False}
    assert back["checkpoint"] == {"every": 0, "every_minutes": 10.0, "keep": 3, "shards": True}
    assert set(back) == {"run", "data", "model", "algorithm", "runtime", "system", "checkpoint", "guard",
                         "watchdog", "results"}


def test_set_overrides_are_in_the_output(capsys):
    rc, out, _ = run_config(capsys, str(ROOT / "jobs" / "quickstart.toml"), "--set", "algorithm.lr=0.2",
                            "--set", "model.mlp.hidden=[8,4]", "--set", "algorithm.name=fednova")
    assert rc == 0
    back = tomllib.loads(out)
    assert back["algorithm"]["lr"] == 0.2
    assert back["model"]["mlp"]["hidden"] == [8, 4]
    assert back["algorithm"]["server"] == "nova"              # the preset's slot, resolved
    assert back["algorithm"]["nova"] == {"tau_eff": "auto", "value": 1.0}   # its table, with defaults
    assert "# --set algorithm.lr=0.2" in out.splitlines()


def test_bad_job_exits_2_naming_the_key(capsys):
    rc, out, err = run_config(capsys, str(ROOT / "jobs" / "quickstart.toml"), "--set", "algorithm.lr=-1")
    assert rc == 2 and out == ""
    assert "algorithm.lr = -1.0 must be greater than 0" in err


def test_defaults_algorithm_lists_lr_with_default_type_and_help(capsys):
    rc, out, _ = run_config(capsys, "--defaults", "algorithm")
    assert rc == 0
    lines = [line.strip() for line in out.splitlines()]
    row = next(line for line in lines if line.startswith("lr = "))
    assert row.split() == ["lr", "=", "0.05", "number,", ">", "0"]
    assert lines[lines.index(row) + 1] == "client learning rate of the local SGD steps (before any lr schedule)"
    assert any(line.startswith("local = (unset)")
               and line.endswith("one of: sgd | prox | scaffold | vr | dyn, or unset") for line in lines)
    assert "random_epochs, client_steps, nova, disco, gsnr, straggler, gift, adacomm, afl, lga, dyn" in lines   # its tables


def test_defaults_of_a_component(capsys):
    rc, out, _ = run_config(capsys, "--defaults", "data.dirichlet")
    assert rc == 0
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0].startswith("[data.dirichlet]  partition: class-wise Dirichlet")
    row = next(line for line in lines if line.startswith("alpha = "))
    assert row.split() == ["alpha", "=", "0.5", "number,", ">", "0"]
    assert "Dirichlet concentration of each class's split over clients; smaller is more skewed" in lines
    rc, out, _ = run_config(capsys, "--defaults", "system")
    assert rc == 0 and any(line.split()[:3] == ["downlink_mbps", "=", "inf"] for line in out.splitlines())
    rc, out, _ = run_config(capsys, "--defaults", "model.lenet5")
    assert rc == 0 and "(no options)" in out


def test_defaults_without_section_lists_sections_and_components_then_all_their_keys(capsys):
    rc, out, _ = run_config(capsys, "--defaults")
    assert rc == 0
    listing, _, reference = out.partition("\n\n[")
    first = [line.split()[0] for line in listing.splitlines() if line.startswith("  ")]
    assert first[:10] == ["run", "data", "model", "algorithm", "runtime", "system", "checkpoint", "guard",
                          "watchdog", "results"]
    assert {"data.dirichlet", "data.digits", "model.mlp", "algorithm.gsnr"} <= set(first)
    for name in ("algorithm", "data.dirichlet", "model.mlp", "algorithm.afl"):   # every table, as --defaults NAME
        _, one, _ = run_config(capsys, "--defaults", name)
        assert one in out
    assert "\n  alpha = 0.5 " in reference and "\n  lr = 0.05 " in reference


def test_unknown_section_exits_2_with_close_matches(capsys):
    rc, out, err = run_config(capsys, "--defaults", "algoritm")
    assert rc == 2 and out == ""
    assert "unknown section 'algoritm' for --defaults; did you mean algorithm?" in err
    assert "  data.dirichlet" in err                         # and the list of what there is
    rc, _, err = run_config(capsys, "--defaults", "dirichlet")
    assert rc == 2 and "did you mean data.dirichlet?" in err
    rc, _, err = run_config(capsys, "--defaults", "zzzz")
    assert rc == 2 and "none is close" in err


def test_usage_errors_exit_2(capsys):
    rc, _, err = run_config(capsys)
    assert rc == 2 and "give a job file" in err
    rc, _, err = run_config(capsys, str(ROOT / "jobs" / "quickstart.toml"), "--defaults", "run")
    assert rc == 2 and "takes no JOB" in err


def test_from_dict_refuses_a_sweep_table():
    with pytest.raises(ConfigError) as exc:
        config.from_dict({"sweep": {"run.seed": [0, 1]}, "run": {"rounds": 2}})
    assert exc.value.problems == ["this job declares a [sweep]; run it with `hpcfl sweep JOB` (or remove the "
                                  "[sweep] table)"]


def test_type_and_constraint_text():
    assert config_cmd.type_text(int | None) == "integer or unset"
    assert config_cmd.type_text(tuple[float, ...]) == "list of number"
    assert config_cmd.type_text(bool) == "true/false"
    assert config_cmd.constraint_text({"gt": 0, "le": 1, "choices": ("a",)}) == "> 0, <= 1"
    assert config_cmd.constraint_text({}) == ""


def test_a_policy_in_two_slots_gets_one_table(capsys):
    """FedDyn's dyn is both the local and the server policy: [algorithm.dyn] was written twice (exit 2)."""
    rc, out, err = run_config(capsys, str(ROOT / "jobs" / "quickstart.toml"), "--set", "algorithm.name=feddyn")
    assert rc == 0, err
    assert out.count("\n[algorithm.dyn]") == 1
    back = tomllib.loads(out)
    assert back["algorithm"]["local"] == back["algorithm"]["server"] == "dyn" and "dyn" in back["algorithm"]
