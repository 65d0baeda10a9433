"""runtime.deterministic: torch's deterministic kernels switched on before CUDA starts, and an operation
without one stops the run with a configuration error naming it (exit 2 from the CLI)."""

import os

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpcfl import cli, config
from hpcfl.engine import setup, simulation
from hpcfl.parallel.runtime import CUBLAS_CONFIG, NondeterministicOp, configure_determinism
from runner import job


@pytest.fixture(autouse=True)
def _restore_torch_flags():
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]
    if saved[3] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[3]


def test_the_switch_sets_torch_cudnn_and_cublas(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.backends.cudnn.benchmark = True
    configure_determinism(True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_CONFIG == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")      # the user's own valid choice is kept
    configure_determinism(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    configure_determinism(False)
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic


@pytest.mark.parametrize("on", [True, False])
def test_prepare_sets_it_before_the_device_is_chosen(monkeypatch, on):
    seen = []
    real = setup.place

    def spy(comm, choice, share):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real(comm, choice, share)

    monkeypatch.setattr(setup, "place", spy)   # where prepare finds it
    simulation.prepare(config.from_dict(job(**{"runtime.deterministic": on})), MPI.COMM_SELF)
    assert seen == [on]


def nondeterministic_setup(on: bool):
    """A run whose model calls ``Tensor.put_``, which has no deterministic kernel (on the CPU too)."""
    s = simulation.prepare(config.from_dict(job(**{"runtime.deterministic": on})), MPI.COMM_SELF)
    forward = s.model.module.forward

    def with_put(x):
        out = forward(x)
        out.detach().clone().put_(torch.tensor([0]), torch.tensor([0.0], dtype=out.dtype))
        return out

    s.model.module.forward = with_put
    return s


def test_an_operation_without_a_deterministic_kernel_is_named_and_stops_the_run():
    with pytest.raises(NondeterministicOp, match=r"no deterministic kernel for put_ \(model 'mlp' on cpu\).*"
                                                 r"runtime.deterministic = false"):
        simulation.run(nondeterministic_setup(True))


def test_switched_off_the_same_run_goes_through():
    x = simulation.run(nondeterministic_setup(False))
    assert np.isfinite(x).all()


def test_other_runtime_errors_pass_unchanged():
    assert NondeterministicOp.match(RuntimeError("CUDA out of memory"), "here") is None
    assert NondeterministicOp.match(ValueError("does not have a deterministic implementation"), "here") is None


def test_the_cli_exits_2_with_the_message(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise NondeterministicOp("runtime.deterministic = true, but torch has no deterministic kernel for X")

    monkeypatch.setattr(simulation, "run", refuse)
    path = tmp_path / "job.toml"
    path.write_text('[run]\nrounds = 2\n[data]\ndataset = "digits"\nnum_clients = 4\n[model]\nname = "logreg"\n'
                    '[runtime]\nprogress = "none"\nthreads = 1\n')
    assert cli.main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "no deterministic kernel for X" in capsys.readouterr().err
