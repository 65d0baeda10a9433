"""Data files' values and shapes are checked at load (issue 37.5): a NaN, Inf or out-of-float32 input,
a scalar or 1-D ``x``, a non-numeric ``x`` each give a DataError naming the file, the array, the
first bad index and the fix, instead of a crash or a misleading divergence rounds later."""

import numpy as np
import pytest

from hpcfl.config import options
from hpcfl.data import dataset_options, load_dataset
from hpcfl.data.container import check_arrays
from hpcfl.errors import DataError


def npz(tmp_path, **arrays):
    np.savez(tmp_path / "d.npz", **arrays)
    return lambda: load_dataset("npz", options.build(dataset_options("npz"), {"file": "d.npz"}, "data.npz"),
                                str(tmp_path), 0)


def good(n=40):
    x = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) / 10
    return x, np.arange(n) % 3


@pytest.mark.parametrize("value, word", [(np.nan, "not finite"), (np.inf, "not finite"), (-np.inf, "not finite")])
def test_a_nonfinite_pixel_names_its_array_and_first_index(tmp_path, value, word):
    x, y = good()
    x[17, 1, 2] = value
    x[30, 0, 0] = value   # a later one is not the one named
    with pytest.raises(DataError) as e:
        npz(tmp_path, x=x, y=y)()
    msg = str(e.value)
    assert "d.npz: x[17, 1, 2] = " in msg and word in msg and "np.nan_to_num" in msg, msg


def test_the_first_bad_index_is_found_past_the_first_block_of_rows():
    x, y = np.zeros((10000, 2), np.float64), np.zeros(10000, np.int64)
    x[9001, 1] = np.nan
    with pytest.raises(DataError, match=r"f\.npz: x\[9001, 1\] = nan is not finite"):
        check_arrays("f.npz", x, y, "x/y")


def test_a_float64_value_beyond_float32_is_refused_before_it_becomes_inf(tmp_path):
    x, y = good()
    x = x.astype(np.float64)
    x[3, 0, 1] = 1e300
    with pytest.raises(DataError, match=r"x\[3, 0, 1\] = 1e\+300 is beyond float32's range"):
        npz(tmp_path, x=x, y=y)()


def test_a_bad_test_input_is_named_as_x_test(tmp_path):
    x, y = good()
    xte = x[:5].copy()
    xte[4, 1, 1] = np.nan
    with pytest.raises(DataError, match=r"x_test\[4, 1, 1\] = nan is not finite"):
        npz(tmp_path, x=x, y=y, x_test=xte, y_test=y[:5])()


@pytest.mark.parametrize("x", [np.float32(3.0), np.arange(40, dtype=np.float32)])
def test_a_scalar_or_one_dimensional_x_is_a_shape_error(tmp_path, x):
    with pytest.raises(DataError, match=r"d\.npz: x has shape \(.*\); expected one row per sample"):
        npz(tmp_path, x=x, y=np.arange(40) % 2)()


def test_a_non_numeric_x_is_refused(tmp_path):
    with pytest.raises(DataError, match=r"x has dtype <U1; expected numbers"):
        npz(tmp_path, x=np.array([["a"], ["b"]] * 20), y=np.arange(40) % 2)()


def test_good_data_still_loads_exactly(tmp_path):
    x, y = good()
    ds = npz(tmp_path, x=x, y=y, x_test=x[:5], y_test=y[:5])()
    assert ds.x_train.tobytes() == x.tobytes() and ds.input_shape == (2, 3)
