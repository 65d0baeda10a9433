"""A model of your own: each build-time rule refused with its words and the model's name, the
check leaving the engine's model and torch's RNG bitwise as without it, and the vectorise choice
said in one line (hpcfl/models/plugin.py, hpcfl/client/block.py)."""

import pytest
import torch
from plugin_code import MODELS, job_text, write_module

from hpcfl import config, models, plugins
from hpcfl.errors import ConfigError

# Each model breaks one rule; "ok" keeps all of them.
RULES = '''
import random
import numpy as np
import torch
from torch import nn


def ok(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


def not_a_module(input_shape, num_classes):
    return [nn.Linear(3, num_classes)]


def no_params(input_shape, num_classes):
    return nn.Flatten()


def frozen(input_shape, num_classes):
    m = ok(input_shape, num_classes)
    m.requires_grad_(False)
    return m


class IntParam(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.lin = ok(input_shape, num_classes)
        self.steps = nn.Parameter(torch.zeros(1, dtype=torch.int64), requires_grad=False)

    def forward(self, x):
        return self.lin(x)


def batch_norm(input_shape, num_classes):
    return nn.Sequential(nn.BatchNorm2d(input_shape[0]), ok(input_shape, num_classes))


class BoolMask(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.lin = ok(input_shape, num_classes)
        self.register_buffer("mask", torch.ones(num_classes, dtype=torch.bool))

    def forward(self, x):
        return self.lin(x)


def numpy_init(input_shape, num_classes):
    m = ok(input_shape, num_classes)
    with torch.no_grad():
        m[1].weight.copy_(torch.from_numpy(np.random.normal(size=tuple(m[1].weight.shape))))
    return m


def python_init(input_shape, num_classes):
    m = ok(input_shape, num_classes)
    with torch.no_grad():
        m[1].bias.fill_(random.random())
    return m


def wrong_width(input_shape, num_classes):
    return ok(input_shape, num_classes + 1)


def misfit(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(7, num_classes))


def int_logits(input_shape, num_classes):
    class ToInt(nn.Module):
        def forward(self, x):
            return x.long()

    return nn.Sequential(ok(input_shape, num_classes), ToInt())


def build_fails(input_shape, num_classes):
    raise ValueError(f"no layout for {input_shape}")


def dropout(input_shape, num_classes):
    return nn.Sequential(nn.Dropout(0.1), ok(input_shape, num_classes))
'''

SHAPE, CLASSES = (1, 8, 8), 10


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rules")
    return folder, write_module(folder, RULES, "rules")


def options(rules, attr):
    folder, name = rules
    return models.model_options(f"{name}:{attr}", [folder])()


def refusal(rules, attr) -> str:
    opts = options(rules, attr)
    torch.manual_seed(0)
    with pytest.raises(ConfigError) as err:
        models.build_model(plugins.of(opts).name, opts, SHAPE, CLASSES)
    msg = str(err.value)
    assert f"model.name = '{rules[1]}:{attr}'" in msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("attr,words", [
    ("not_a_module", "the call returned a list, not a torch.nn.Module; the rule: the call returns a torch.nn.Module"),
    ("no_params", "the model has no trainable parameter; the rule: the model has at least one trainable parameter"),
    ("frozen", "the model has no trainable parameter"),
    ("IntParam", "parameter 'steps' is torch.int64; the rule: every parameter is floating point"),
    ("batch_norm", "buffer '0.num_batches_tracked' is torch.int64; the rule: no buffer is an integer or bool tensor "
                   "(the engine moves a model as one float vector); fix: build BatchNorm with "
                   "track_running_stats=False, use GroupNorm, or delete the buffer"),
    ("BoolMask", "buffer 'mask' is torch.bool; the rule: no buffer is an integer or bool tensor"),
    ("numpy_init", "built twice from the same torch seed, its '1.weight' differs; the rule: built twice from the "
                   "same torch seed, the model is bitwise the same; fix: draw the initial weights from torch's "
                   "global RNG only"),
    ("python_init", "built twice from the same torch seed, its '1.bias' differs"),
    ("wrong_width", "its forward pass of zeros of shape (2, 1, 8, 8) returned torch.float32 of shape (2, 11), "
                    "expected (2, 10); the rule: a batch (2, *input_shape) of float32 zeros on the CPU gives "
                    "floating-point logits (2, num_classes)"),
    ("int_logits", "returned torch.int64 of shape (2, 10), expected (2, 10)"),
    ("misfit", "a forward pass of zeros of shape (2, 1, 8, 8) raised RuntimeError: mat1 and mat2 shapes cannot be "
               "multiplied (2x64 and 7x10)"),
    ("build_fails", "building it for input_shape (1, 8, 8) and num_classes 10 raised ValueError: no layout for "
                    "(1, 8, 8) (at "),
])
def test_each_rule_is_refused_with_its_words(rules, attr, words):
    assert words in refusal(rules, attr)


def test_a_refused_build_names_the_users_line(rules):
    assert f"raised ValueError: no layout for (1, 8, 8) (at {rules[0] / rules[1]}.py:" in refusal(rules, "build_fails")


@pytest.mark.parametrize("attr", ["ok", "dropout"])   # dropout: the check's forward pass draws masks
def test_the_check_leaves_the_model_and_torchs_rng_as_without_it(rules, attr):
    folder, name = rules
    opts = options(rules, attr)
    torch.manual_seed(123)
    checked = models.build_model(f"{name}:{attr}", opts, SHAPE, CLASSES)
    after_checked = torch.rand(4)
    torch.manual_seed(123)
    plain = plugins.of(opts).obj(SHAPE, CLASSES)   # the callable alone, no check
    after_plain = torch.rand(4)
    for (n, a), (_, b) in zip(checked.state_dict().items(), plain.state_dict().items()):
        assert a.numpy().tobytes() == b.numpy().tobytes(), n
    assert after_checked.numpy().tobytes() == after_plain.numpy().tobytes()


def test_a_plugin_needs_its_own_options_object(rules):
    with pytest.raises(TypeError, match="needs the options model_options"):
        models.build_model(f"{rules[1]}:ok", models.model_options("mlp")(), SHAPE, CLASSES)


# ---- how it trains: one line when 'auto' keeps the loop -------------------------------------------

def setup_lines(tmp_path, capsys, model, *sets):
    from hpcfl.engine import simulation
    from hpcfl.parallel.comm import world

    (tmp_path / "job.toml").write_text(job_text(model))
    cfg = config.load(str(tmp_path / "job.toml"), list(sets))
    capsys.readouterr()
    s = simulation.prepare(cfg, world())
    return s, [ln for ln in capsys.readouterr().out.splitlines() if "vectorize" in ln]


def test_auto_on_the_cpu_trains_a_plugin_one_client_at_a_time_and_says_why(tmp_path, capsys):
    nets = write_module(tmp_path, MODELS, "nets")
    s, lines = setup_lines(tmp_path, capsys, f"{nets}:SmallCNN")
    assert s.block is None
    assert lines == [f"hpcfl: runtime.vectorize = 'auto': model '{nets}:SmallCNN' trains one client at a time: on "
                     f"the CPU 'auto' batches only models with a closed-form batched gradient (batched_loss_grad), "
                     f"and it has none; runtime.vectorize = 'on' batches it anyway"]
    s, lines = setup_lines(tmp_path, capsys, f"{nets}:SmallCNN", "runtime.vectorize=on")
    assert s.block is not None and lines == []
    s, lines = setup_lines(tmp_path, capsys, f"{nets}:SmallCNN", "runtime.vectorize=off")
    assert s.block is None and lines == []


def test_a_plugin_that_cannot_be_vectorised_says_why_or_is_refused_with_on(tmp_path, capsys, rules):
    folder, name = rules
    (folder / "job.toml").write_text(job_text(f"{name}:dropout"))
    s, lines = setup_lines(folder, capsys, f"{name}:dropout")
    assert s.block is None and lines[0].endswith("trains one client at a time: the model uses dropout (per-client "
                                                 "random masks)")
    with pytest.raises(ConfigError, match=f"runtime.vectorize = 'on' cannot train model '{name}:dropout'"):
        setup_lines(folder, capsys, f"{name}:dropout", "runtime.vectorize=on")


def test_the_bench_bare_loop_builds_a_plugin_model_as_the_engine_does(tmp_path, monkeypatch):
    """hpcfl bench's bare loop takes a plug-in name too; its first model is the engine's, bit for bit,
    when both start from the same seed (the check's two builds change nothing)."""
    import numpy as np
    from mpi4py import MPI

    from hpcfl.bench.bare import run_bare

    monkeypatch.chdir(tmp_path)   # a dict job: the module is looked for in the current folder
    nets = write_module(tmp_path, MODELS, "nets")
    job = {"run": {"rounds": 1, "seed": 2, "eval_every": 0}, "data": {"dataset": "digits", "num_clients": 4},
           "model": {"name": f"{nets}:SmallCNN", "SmallCNN": {"channels": 2}},
           "algorithm": {"clients_per_round": 2, "local_steps": 1, "lr": 1e-30}, "runtime": {"threads": 1}}
    final = run_bare(job, MPI.COMM_SELF)["final"]   # lr 1e-30: steps too small to move a float32 weight
    torch.manual_seed(2)   # what run_bare seeds before it builds
    plain = plugins.of(models.model_options(f"{nets}:SmallCNN")(channels=2)).obj((1, 8, 8), 10, channels=2)
    expect = torch.nn.utils.parameters_to_vector(plain.parameters()).detach().numpy()
    assert np.asarray(final).tobytes() == expect.tobytes() and len(expect) == 2 * 9 + 2 + 2 * 10 + 10
