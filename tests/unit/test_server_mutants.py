"""The server rules' defaults, their normaliser, host and tensor sums alike, and the server optimizer's
lr scaling and output dtype: hand-computed values (the mutation run showed them unpinned)."""

import numpy as np
import pytest
import torch

from hpcfl.algorithms.server import (
    AverageRule,
    NovaOptions,
    NovaRule,
    ServerOptimizer,
    divide_,
)

S = {"weight": 4.0, "weight_anorm": 8.0, "weight_steps": 12.0}


@pytest.mark.parametrize("as_tensor", [False, True])
def test_average_rule_divides_by_the_weight_sum_by_default_and_leaves_the_sum_alone(as_tensor):
    d = np.array([4.0, -8.0, 2.0])
    delta_sum = torch.tensor(d) if as_tensor else d.copy()
    agg = AverageRule(3).aggregate(delta_sum, S)
    assert type(agg) is type(delta_sum)
    assert np.asarray(agg).tolist() == [1.0, -2.0, 0.5]
    assert np.asarray(delta_sum).tolist() == d.tolist()
    assert np.asarray(AverageRule(3, normalize=False).aggregate(delta_sum, S)).tolist() == d.tolist()


@pytest.mark.parametrize("as_tensor", [False, True])
def test_nova_rule_scales_the_parameters_by_tau_eff_and_normalises_by_default(as_tensor):
    """agg = tau_eff * sum / sum p over the parameters; the buffer entry (index 2) only / sum p."""
    d = np.array([4.0, -8.0, 2.0])
    delta_sum = torch.tensor(d) if as_tensor else d.copy()
    rule = NovaRule(NovaOptions(), num_params=2, prox=False)       # auto, no prox: anorm, tau_eff = 8 / 4
    assert rule.mode == "anorm"
    assert np.asarray(rule.aggregate(delta_sum, S)).tolist() == [2.0, -4.0, 0.5]
    assert np.asarray(delta_sum).tolist() == d.tolist()
    raw = NovaRule(NovaOptions(), num_params=2, prox=True, normalize=False)   # steps: tau_eff = 12 / 4
    assert raw.mode == "steps"
    assert np.asarray(raw.aggregate(delta_sum, S)).tolist() == [12.0, -24.0, 2.0]


def test_divide_on_the_device_divides_by_a_device_scalar():
    """The meta device stands in for a GPU (no values, but every call must be valid there)."""
    x = torch.zeros(3, dtype=torch.float64, device="meta")
    out = divide_(x, 3.0)
    assert out is x and out.device.type == "meta" and out.dtype == torch.float64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_plain_step_on_tensors_is_x_plus_lr_agg_in_the_model_dtype(dtype):
    opt = ServerOptimizer(lr=0.5, momentum=0.0)
    x = torch.tensor([1.0, 2.0], dtype=dtype)
    new = opt.apply(x, torch.tensor([4.0, -2.0], dtype=torch.float64))
    assert isinstance(new, torch.Tensor) and new.dtype == dtype
    assert new.tolist() == [3.0, 1.0]


def test_plain_step_on_arrays_keeps_the_model_dtype():
    new = ServerOptimizer(lr=0.5, momentum=0.0).apply(np.array([1.0, 2.0], np.float32), np.array([4.0, -2.0]))
    assert new.dtype == np.float32 and new.tolist() == [3.0, 1.0]


def test_momentum_without_lr_scaling_ignores_the_client_lr():
    """FedAvgM (lr_scaled False, the default): buf = beta buf - agg; x <- x - lr buf, whatever eta_t is."""
    opt = ServerOptimizer(lr=1.0, momentum=0.5)
    x = np.array([1.0, 2.0], np.float32)
    x = opt.apply(x, np.array([2.0, 4.0]), client_lr=0.25)     # buf = (-2, -4)
    assert x.dtype == np.float32 and x.tolist() == [3.0, 6.0]
    x = opt.apply(x, np.array([2.0, 0.0]), client_lr=0.5)      # buf = (-1, -2) + (-2, 0)
    assert x.tolist() == [6.0, 8.0]


def test_momentum_with_lr_scaling_divides_by_eta_t_and_multiplies_back():
    """SlowMo: buf = beta buf - agg / eta_t; x <- x - lr eta_t buf."""
    opt = ServerOptimizer(lr=1.0, momentum=0.5, lr_scaled=True)
    x = opt.apply(np.array([1.0, 2.0]), np.array([2.0, 4.0]), client_lr=0.25)   # buf = (-8, -16)
    assert x.tolist() == [3.0, 6.0]
    x = opt.apply(x, np.array([2.0, 0.0]), client_lr=0.5)                      # buf = (-4, -8) + (-4, 0)
    assert x.tolist() == [7.0, 10.0]
