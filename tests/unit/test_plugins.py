"""Plug-in names ("module:attribute") in model.name, data.dataset and data.partition: finding the
module, the options generated from the signature, and their place in the job (hpcfl/plugins.py)."""

import dataclasses
import sys

import pytest
from plugin_code import DATA, MODELS, job_text, write_module

from hpcfl import config, plugins
from hpcfl.errors import ConfigError


def load_job(folder, text, *sets):
    (folder / "job.toml").write_text(text)
    return config.load(str(folder / "job.toml"), list(sets))


def refused(folder, text, *sets) -> str:
    with pytest.raises(ConfigError) as err:
        load_job(folder, text, *sets)
    return str(err.value)


@pytest.fixture
def nets(tmp_path):
    return write_module(tmp_path, MODELS, "nets")


# ---- finding the module -------------------------------------------------------------------------

def test_the_module_is_found_next_to_the_job_file_from_any_folder(tmp_path, nets, monkeypatch):
    monkeypatch.chdir("/")   # neither the current folder nor PYTHONPATH holds it: the job file's folder does
    cfg = load_job(tmp_path, job_text(f"{nets}:SmallCNN"))
    plugin = plugins.of(cfg.model_options)
    assert plugin.file == str(tmp_path / f"{nets}.py") and plugin.obj.__name__ == "SmallCNN"
    import hashlib
    assert plugin.sha256 == hashlib.sha256((tmp_path / f"{nets}.py").read_bytes()).hexdigest()
    assert cfg.plugins() == {"model.name": {"name": f"{nets}:SmallCNN", "file": plugin.file, "sha256": plugin.sha256}}


def test_an_installed_module_of_the_same_name_wins_over_the_job_folder(tmp_path):
    # the folders are appended to sys.path: 'textwrap' next to the job is not the standard library's
    (tmp_path / "textwrap.py").write_text("raise SystemExit('the fake was imported')\n")
    cfg = load_job(tmp_path, job_text("mlp", dataset="textwrap:dedent"))   # dedent(text): one leading parameter
    assert plugins.of(cfg.dataset_options).file == sys.modules["textwrap"].__file__ != str(tmp_path / "textwrap.py")


def test_a_missing_module_names_the_key_the_cause_the_folders_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)
    msg = refused(tmp_path, job_text("no_such_nets_4f1:SmallCNN"))
    assert "model.name = 'no_such_nets_4f1:SmallCNN'" in msg
    assert "ModuleNotFoundError: No module named 'no_such_nets_4f1'" in msg
    assert f"the job file's folder {tmp_path}" in msg and f"the current folder {tmp_path.parent}" in msg
    assert "next to the job file, or its folder on PYTHONPATH" in msg
    assert "\n" not in msg   # one line


def test_a_module_that_raises_names_the_exception_and_its_line(tmp_path):
    name = write_module(tmp_path, "import math\n\ndef helper():\n    return 1 / 0\n\nhelper()\n", "boom")
    msg = refused(tmp_path, job_text(f"{name}:Net"))
    assert f"importing module {name!r} raised ZeroDivisionError: division by zero (at {tmp_path / name}.py:4)" in msg
    name = write_module(tmp_path, "import no_such_dependency_77\n", "dep")
    msg = refused(tmp_path, job_text(f"{name}:Net"))   # the module is found; what it imports is not
    assert f"importing module {name!r} raised ModuleNotFoundError: No module named 'no_such_dependency_77' " \
           f"(at {tmp_path / name}.py:1)" in msg
    name = write_module(tmp_path, "import numpy as np\n\nnp.linalg.inv(np.zeros((2, 2)))\n", "lib")
    msg = refused(tmp_path, job_text(f"{name}:Net"))   # raised inside numpy: the user's line that called it
    assert f"raised LinAlgError: Singular matrix (at {tmp_path / name}.py:3)" in msg
    name = write_module(tmp_path, "def f(:\n", "syntax")
    assert f"raised SyntaxError: invalid syntax (at {tmp_path / name}.py:1)" in refused(tmp_path, job_text(f"{name}:f"))


def test_a_missing_attribute_says_did_you_mean(tmp_path, nets):
    msg = refused(tmp_path, job_text(f"{nets}:SmallCnn"))
    assert f"module {nets!r} ({tmp_path / nets}.py) has no attribute 'SmallCnn'; did you mean {nets}:SmallCNN?" in msg
    msg = refused(tmp_path, job_text(f"{nets}:zzz"))
    assert "its public names: SmallCNN, mlp, needs_width, nn, torch" in msg


def test_not_callable_and_bad_names_are_refused(tmp_path):
    name = write_module(tmp_path, "WIDTH = 3\n", "consts")
    assert f"{name}.WIDTH = 3 is not callable" in refused(tmp_path, job_text(f"{name}:WIDTH"))
    for bad in ("nets:", ":Net", "a b:Net", "nets:Small.CNN"):
        assert "is not of the form \"module.path:attribute\"" in refused(tmp_path, job_text(bad))


def test_unknown_builtin_names_suggest_a_plugin(tmp_path):
    msg = refused(tmp_path, job_text("lenett5"))
    assert "model.name = 'lenett5' is not a known model; did you mean 'lenet5'?" in msg
    assert 'a model of your own: model.name = "yourmodule:YourModel"' in msg
    msg = refused(tmp_path, job_text("mlp", dataset="digitz", partition="iidd"))
    assert "data.dataset = 'digitz' is not known; did you mean 'digits'?" in msg
    assert 'a dataset of your own: data.dataset = "yourmodule:load"' in msg
    assert 'a partition of your own: data.partition = "yourmodule:split"' in msg


# ---- options ------------------------------------------------------------------------------------

def test_options_come_from_the_table_named_after_the_attribute_with_their_types(tmp_path, nets):
    cfg = load_job(tmp_path, job_text(f"{nets}:mlp", extra="[model.mlp]\nhidden = [8, 4]\nscale = 2\n"))
    opts = cfg.model_options
    assert dataclasses.asdict(opts) == {"hidden": (8, 4), "scale": 2.0, "bias": True, "act": "relu",
                                        "depth_check": 0}
    assert isinstance(opts.scale, float)   # an int in TOML for a float parameter, as for built-ins
    d = cfg.to_dict()["model"]
    assert d == {"name": f"{nets}:mlp", "mlp": {"hidden": [8, 4], "scale": 2.0, "bias": True, "act": "relu",
                                                "depth_check": 0}}
    # the dict reads back as the same job (what results.h5 and the resume digest hold)
    assert config.from_dict(cfg.to_dict(), str(tmp_path)).to_json() == cfg.to_json()
    assert plugins.of(opts).call(opts, (1, 8, 8), 10)[1].out_features == 8   # hidden reaches the callable


def test_a_list_option_reaches_a_list_parameter_as_a_list(tmp_path):
    name = write_module(tmp_path, "def f(seed, sizes: list[int] = [1], t: tuple[int, ...] = (2,)):\n"
                                  "    return type(sizes).__name__, type(t).__name__\n", "lists")
    cfg = load_job(tmp_path, job_text("mlp", dataset=f"{name}:f"))
    assert plugins.of(cfg.dataset_options).call(cfg.dataset_options, 0) == ("list", "tuple")


@pytest.mark.parametrize("extra,words", [
    ("[model.mlp]\nhiden = [8]\n", "unknown key model.mlp.hiden; did you mean model.mlp.hidden?"),
    ("[model.mlp]\nscale = \"big\"\n", "model.mlp.scale = 'big' has the wrong type; expected a number"),
    ("[model.mlp]\nhidden = 8\n", "model.mlp.hidden = 8 has the wrong type; expected a list of an integer"),
    ("[model.mlp]\nbias = 1\n", "model.mlp.bias = 1 has the wrong type; expected true or false"),
    ("[model.mlpp]\nscale = 1.0\n", f"[model.mlpp] is given but model.name = 'NETS:mlp', whose options are "
                                    f"[model.mlp]; rename the table"),
])
def test_option_problems_read_as_for_builtins(tmp_path, nets, extra, words):
    assert words.replace("NETS", nets) in refused(tmp_path, job_text(f"{nets}:mlp", extra=extra))


def test_a_parameter_without_a_default_is_a_required_key(tmp_path, nets):
    msg = refused(tmp_path, job_text(f"{nets}:needs_width"))
    assert "model.needs_width.width is required and missing: it has no default; add width = ... (an integer) " \
           "under [model.needs_width]" in msg
    cfg = load_job(tmp_path, job_text(f"{nets}:needs_width", extra="[model.needs_width]\nwidth = 5\n"))
    assert cfg.model_options.width == 5


def test_a_parameter_without_an_option_type_is_refused_naming_it(tmp_path):
    name = write_module(tmp_path, "def f(seed, device=None):\n    pass\n", "untyped")
    msg = refused(tmp_path, job_text("mlp", dataset=f"{name}:f"))
    assert "data.dataset" in msg and "parameter 'device' of f(seed, device=None) has no option type" in msg
    name = write_module(tmp_path, "def f():\n    pass\n", "nofixed")
    msg = refused(tmp_path, job_text("mlp", partition=f"{name}:f"))
    assert "f() takes 0 positional parameter(s); the contract is split(labels, num_clients: int, seed: int" in msg


def test_optional_annotations_and_keyword_only_parameters(tmp_path):
    name = write_module(tmp_path, "def f(seed, *, root: str | None = None, k: int, **rest):\n    pass\n", "kw")
    cfg = load_job(tmp_path, job_text("mlp", dataset=f"{name}:f", extra="[data.f]\nk = 2\n"))
    assert dataclasses.asdict(cfg.dataset_options) == {"root": None, "k": 2}
    cfg = load_job(tmp_path, job_text("mlp", dataset=f"{name}:f", extra="[data.f]\nk = 2\nroot = \"/x\"\n"))
    assert cfg.dataset_options.root == "/x"


def test_tables_that_two_components_would_share_are_refused(tmp_path):
    name = write_module(tmp_path, DATA, "data")
    msg = refused(tmp_path, job_text("mlp", dataset=f"{name}:load", partition=f"{name}:load"))
    assert "would both take their options from [data.load]; rename one of the two functions" in msg
    other = write_module(tmp_path, "def root(seed):\n    pass\n", "rooty")
    msg = refused(tmp_path, job_text("mlp", dataset=f"{other}:root"))
    assert "would take its options from [data.root], but data.root is a key of [data]" in msg


def test_set_to_another_plugin_drops_the_old_table(tmp_path, nets):
    (tmp_path / "job.toml").write_text(job_text(f"{nets}:mlp", extra="[model.mlp]\nhidden = [8]\n"))
    cfg = config.load(str(tmp_path / "job.toml"), [f"model.name={nets}:SmallCNN"])
    assert dataclasses.asdict(cfg.model_options) == {"channels": 4}
    assert any("[model.mlp] is left out" in n for n in cfg.notes)


def test_a_dict_job_looks_in_the_current_folder(tmp_path, nets, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config.load({"data": {"dataset": "digits"}, "model": {"name": f"{nets}:SmallCNN"}})
    assert plugins.of(cfg.model_options).file == str(tmp_path / f"{nets}.py")
