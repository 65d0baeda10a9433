"""Code of your own through the real command line: a plug-in model run by ``hpcfl run`` is bitwise the
``hpcfl.run`` call's run and resumes bitwise after a SIGKILL; an unimportable plug-in or
``$HPCFL_ALGORITHMS`` module, or bad options, end with exit 2 and one message, no traceback, on 1 rank
and on every rank of 2."""

import signal

import pytest
from clirun import ROOT, assert_same_run, command, hpcfl
from plugin_code import MODELS, job_text, write_module

import hpcfl as api
from hpcfl.results import load

RESUMABLE = "[checkpoint]\nevery = 1\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("plug")
    return d, write_module(d, MODELS, "nets")


def job(folder, model, extra="", rounds=3):
    d, nets = folder
    path = d / f"job_{model.split(':')[-1]}_{rounds}_{abs(hash(extra)) % 10000}.toml"
    path.write_text(job_text(model.replace("NETS", nets), rounds=rounds, extra=extra))
    return str(path)


def test_the_cli_run_is_bitwise_the_python_api_run(folder, tmp_path):
    jobfile = job(folder, "NETS:mlp", "[model.mlp]\nhidden = [8]\nscale = 0.5\n")
    p = hpcfl("run", jobfile, "--out", str(tmp_path / "cli"))   # run from the repository root, not the job's folder
    assert p.returncode == 0, p.stderr
    assert "trains one client at a time" in p.stdout
    res = api.run(jobfile, out=tmp_path / "api")
    assert_same_run(tmp_path / "cli", tmp_path / "api")
    r = load(tmp_path / "cli")
    assert r.config["model"]["mlp"] == {"hidden": [8], "scale": 0.5, "bias": True, "act": "relu", "depth_check": 0}
    assert r.attrs["plugins"]["model.name"]["file"] == str(folder[0] / f"{folder[1]}.py")
    # the results rebuild the trained model from the recorded module, from any folder
    model = res.model()
    assert type(model).__module__ == "torch.nn.modules.container" and model[1].out_features == 8


def test_kill_and_resume_of_a_plugin_model_is_bitwise_the_uninterrupted_run(folder, tmp_path):
    jobfile = job(folder, "NETS:SmallCNN", RESUMABLE + "[model.SmallCNN]\nchannels = 3\n", rounds=5)
    assert hpcfl("run", jobfile, "--out", str(tmp_path / "ref")).returncode == 0
    p = hpcfl("run", jobfile, "--out", str(tmp_path / "out"), env={"HPCFL_FAULT": "0:train:3:kill"})
    assert p.returncode == -signal.SIGKILL
    p = hpcfl("run", jobfile, "--out", str(tmp_path / "out"))
    assert p.returncode == 0 and "resuming from ckpt-00000003.h5" in p.stdout, p.stdout + p.stderr
    assert_same_run(tmp_path / "ref", tmp_path / "out")
    segments = load(tmp_path / "out").segments
    assert [s["start_round"] for s in segments] == [1, 4]
    module = folder[0] / f"{folder[1]}.py"
    import hashlib
    for s in segments:   # each segment says which code it ran
        assert s["versions"]["plugins"]["model.name"]["sha256"] == hashlib.sha256(module.read_bytes()).hexdigest()


def test_resume_refuses_changed_plugin_options(folder, tmp_path):
    jobfile = job(folder, "NETS:SmallCNN", RESUMABLE, rounds=2)
    assert hpcfl("run", jobfile, "--out", str(tmp_path / "out"), "--set", "run.rounds=1").returncode == 0
    p = hpcfl("run", jobfile, "--out", str(tmp_path / "out"), "--set", "model.SmallCNN.channels=5")
    assert p.returncode == 2 and "model.SmallCNN.channels" in p.stderr, p.stderr


def per_rank_exits(args, ranks, env=None):
    """Run ``hpcfl ARGS`` under mpiexec with each rank's exit code printed by a shell around it."""
    import os
    import shlex
    import subprocess

    inner = " ".join(shlex.quote(a) for a in command(*args))
    cmd = ["timeout", "-s", "KILL", "120", "mpiexec", "-n", str(ranks), "sh", "-c",
           f"{inner}; code=$?; echo \"rank exit $code\" >&2; exit $code"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT, env={**os.environ, **(env or {})})


UNIMPORTABLE = [
    ("no_such_nets_91:Net", "module 'no_such_nets_91' cannot be imported (ModuleNotFoundError: No module named "
                            "'no_such_nets_91'); looked in sys.path"),
    ("BOOM:Net", "importing module 'BOOM' raised ZeroDivisionError: division by zero (at "),
    ("NETS:SmallCnn", "has no attribute 'SmallCnn'; did you mean NETS:SmallCNN?"),
]


@pytest.mark.parametrize("ranks", [0, 2])
@pytest.mark.parametrize("name,words", UNIMPORTABLE, ids=["missing", "raising", "attribute"])
def test_an_unimportable_plugin_exits_2_on_every_rank_without_a_traceback(folder, tmp_path, ranks, name, words):
    d, nets = folder
    boom = write_module(d, "X = 1\nY = X / 0\n", "boom")
    name, words = (s.replace("BOOM", boom).replace("NETS", nets) for s in (name, words))
    args = ("run", job(folder, name), "--out", str(tmp_path / "out"))
    p = per_rank_exits(args, ranks) if ranks else hpcfl(*args)
    assert p.returncode == 2, p.stderr
    assert words in p.stderr and f"model.name = {name!r}" in p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    if ranks:
        assert p.stderr.count("rank exit 2") == ranks, p.stderr
        assert p.stderr.count("config error") == 1   # printed once, by rank 0
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ranks", [0, 2])
def test_an_unimportable_hpcfl_algorithms_module_exits_2_without_a_traceback(tmp_path, ranks):
    args = ("run", str(ROOT / "jobs" / "quickstart.toml"), "--out", str(tmp_path / "out"))
    env = {"HPCFL_ALGORITHMS": "nosuchmod"}
    p = per_rank_exits(args, ranks, env) if ranks else hpcfl(*args, env=env)
    assert p.returncode == 2, p.stderr
    assert "$HPCFL_ALGORITHMS names 'nosuchmod': module 'nosuchmod' cannot be imported" in p.stderr
    assert "on PYTHONPATH" in p.stderr and "unset HPCFL_ALGORITHMS" in p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    if ranks:
        assert p.stderr.count("rank exit 2") == ranks, p.stderr


@pytest.mark.parametrize("sets,words", [
    (["model.mlp.widht=3"], "unknown key model.mlp.widht; valid keys here: act, bias, depth_check, hidden, scale"),
    (["model.mlp.scale=true"], "model.mlp.scale = True has the wrong type; expected a number"),
    (["model.name=NETS:needs_width"], "model.needs_width.width is required and missing"),
])
def test_bad_plugin_options_exit_2_naming_the_key(folder, tmp_path, sets, words):
    sets = [s.replace("NETS", folder[1]) for s in sets]
    p = hpcfl("run", job(folder, "NETS:mlp"), "--out", str(tmp_path / "out"), *[a for s in sets for a in ("--set", s)])
    assert p.returncode == 2 and words in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_hpcfl_config_prints_the_plugin_table_that_reads_back(folder, tmp_path):
    p = hpcfl("config", job(folder, "NETS:mlp", "[model.mlp]\nhidden = [8]\n"))
    assert p.returncode == 0, p.stderr
    assert f"[model.mlp]  # model of your own, {folder[1]}:mlp: An MLP over the flattened input" in p.stdout
    assert "hidden = [8]" in p.stdout and "scale = 1.0" in p.stdout
    saved = tmp_path / "resolved.toml"   # a job saved elsewhere finds the module only on PYTHONPATH
    saved.write_text(p.stdout)
    env = {"PYTHONPATH": f"{folder[0]}:{ROOT}"}
    assert hpcfl("run", str(saved), "--out", str(tmp_path / "out"), env=env).returncode == 0
