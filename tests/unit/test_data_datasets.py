"""Embedded datasets: synthetic_images (workload W's hashes), Synthetic(1,1), GMM-10, digits."""

import hashlib

import numpy as np
import pytest

from hpcfl.config import options
from hpcfl.data import dataset_options, load_dataset, load_labels
from hpcfl.errors import ConfigError


def build(name, table=None):
    return options.build(dataset_options(name), table, f"data.{name}")


def sha16(a):
    return hashlib.sha256(a.tobytes()).hexdigest()[:16]


def test_synthetic_images_reproduces_w_md_exactly():
    ds = load_dataset("synthetic_images", None, None, 0)
    assert ds.x_train.shape == (50000, 3, 32, 32) and ds.x_train.dtype == np.float32
    assert ds.y_train.dtype == np.int64 and ds.x_test.shape == (10000, 3, 32, 32)
    assert sha16(ds.x_train) == "53d6ed9e42f85434"
    assert sha16(ds.y_train) == "11602baa5d0064e3"
    assert sha16(ds.x_test) == "6e86d4c2ca9deee5"
    assert sha16(ds.y_test) == "b9b305371fdc2d21"
    assert ds.num_classes == 10 and ds.input_shape == (3, 32, 32) and ds.natural_clients is None


def test_synthetic_images_labels_only_path():
    ds = load_labels("synthetic_images", None, None, 0)
    assert sha16(ds.y_train) == "11602baa5d0064e3"  # workload W, without drawing 184M normals
    assert ds.x_train.shape == (50000, 3, 32, 32) and ds.x_train.strides == (0, 0, 0, 0)
    assert len(ds.y_test) == 0 and ds.num_classes == 10
    gm = load_labels("gaussian_mixture", None, None, 0)  # no fast path: the full dataset
    assert np.array_equal(gm.y_train, load_dataset("gaussian_mixture", None, None, 0).y_train)


def test_synthetic_images_small_and_seeded():
    opts = build("synthetic_images", {"num_train": 40, "num_test": 8, "num_classes": 4, "image_shape": [1, 5, 5]})
    a = load_dataset("synthetic_images", opts, None, 1)
    assert a.x_train.shape == (40, 1, 5, 5) and a.input_shape == (1, 5, 5) and a.y_train.max() < 4
    b = load_dataset("synthetic_images", opts, None, 1)
    c = load_dataset("synthetic_images", build("synthetic_images", {"num_train": 40, "num_test": 8,
                                              "num_classes": 4, "image_shape": [1, 5, 5], "seed_offset": 1}), None, 0)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.x_train, c.x_train)
    # the recipe: x = 1.5 * means[y] + noise, with means drawn first from the same generator
    rng = np.random.default_rng(1)
    means = rng.standard_normal((4, 1, 5, 5), dtype=np.float32)
    y = rng.integers(0, 4, size=40)
    noise = rng.standard_normal((40, 1, 5, 5), dtype=np.float32)
    assert np.array_equal(a.x_train, means[y] * np.float32(1.5) + noise)


def test_synthetic_1_1_fedprox_recipe():
    ds = load_dataset("synthetic", None, None, 0)
    rs = np.random.RandomState(0)
    sizes = rs.lognormal(4, 2, 30).astype(int) + 50  # the power law, first draw of the recipe
    assert len(ds.natural_clients) == 30
    assert [len(c) for c in ds.natural_clients] == [int(0.9 * s) for s in sizes]
    assert len(ds.y_train) + len(ds.y_test) == sizes.sum()
    assert len(ds.y_test) == sum(s - int(0.9 * s) for s in sizes)
    assert ds.x_train.shape[1:] == (60,) and ds.input_shape == (60,) and ds.num_classes == 10
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.y_train.min() >= 0 and ds.y_train.max() <= 9
    joined = np.concatenate(ds.natural_clients)
    assert np.array_equal(joined, np.arange(len(ds.y_train)))
    # heterogeneity: client label mixes differ a lot
    mixes = [np.bincount(ds.y_train[c], minlength=10) / len(c) for c in ds.natural_clients]
    assert np.std([m.max() for m in mixes]) > 0.05
    iid = load_dataset("synthetic", build("synthetic", {"iid": True, "num_clients": 10}), None, 0)
    assert len(iid.natural_clients) == 10


def test_gaussian_mixture():
    ds = load_dataset("gaussian_mixture", None, None, 0)
    assert ds.x_train.shape == (20000, 20) and ds.x_test.shape == (5000, 20) and ds.num_classes == 10
    centers = np.random.default_rng(0).normal(0, 0.8, size=(10, 6, 20))
    # every training point lies near one of its class's 6 mode centres (noise std 1 in 20-d)
    d = np.linalg.norm(ds.x_train[:200, None, :] - centers[ds.y_train[:200]], axis=2).min(1)
    assert np.median(d) < 5.5
    assert np.array_equal(ds.x_train, load_dataset("gaussian_mixture", None, None, 0).x_train)


def test_digits():
    ds = load_dataset("digits", None, None, 0)
    assert ds.input_shape == (1, 8, 8) and ds.x_train.shape[1:] == (1, 8, 8)
    assert len(ds.y_train) + len(ds.y_test) == 1797
    assert abs(len(ds.y_test) - 0.25 * 1797) < 10
    frac = np.bincount(ds.y_test, minlength=10) / np.bincount(np.concatenate([ds.y_train, ds.y_test]))
    assert np.all(np.abs(frac - 0.25) < 0.02)  # stratified
    assert abs(ds.x_train.mean()) < 1e-4 and abs(ds.x_train.std() - 1) < 1e-4
    per = load_dataset("digits", build("digits", {"test_per_class": 50, "normalize": False}), None, 3)
    assert np.bincount(per.y_test).tolist() == [50] * 10 and len(per.y_train) == 1297
    assert per.x_train.min() >= 0 and per.x_train.max() <= 1
    other = load_dataset("digits", build("digits", {"test_per_class": 50, "normalize": False}), None, 4)
    assert not np.array_equal(per.x_test, other.x_test)
    with pytest.raises(ConfigError, match="data.digits"):
        load_dataset("digits", build("digits", {"test_per_class": 500}), None, 0)


def test_lga_synthetic_shapes_dtypes_labels():
    """Defaults give the FedLGA sanity experiment's sizes (4000 train, 2000 test, d = 32, 10 classes),
    float32 inputs and int64 labels in 0..C-1; the options reshape it (C = 3 means labels 0..2 only)."""
    ds = load_dataset("lga_synthetic", None, None, 0)
    assert ds.x_train.shape == (4000, 32) and ds.x_test.shape == (2000, 32)
    assert ds.x_train.dtype == np.float32 and ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
    assert ds.input_shape == (32,) and ds.num_classes == 10 and ds.natural_clients is None
    assert np.array_equal(np.unique(ds.y_train), np.arange(10)) and np.array_equal(np.unique(ds.y_test), np.arange(10))
    assert np.isfinite(ds.x_train).all() and np.isfinite(ds.x_test).all()
    small = load_dataset("lga_synthetic", build("lga_synthetic", {"num_train": 50, "num_test": 7, "dim": 5,
                                                                  "num_classes": 3}), None, 0)
    assert small.x_train.shape == (50, 5) and small.x_test.shape == (7, 5) and small.input_shape == (5,)
    assert small.y_train.min() >= 0 and small.y_train.max() <= 2 and small.num_classes == 3


def test_lga_synthetic_seeded():
    """The data is a pure function of run.seed + seed_offset: the same seed repeats bit for bit, another
    seed gives other data, and (seed 1, offset 999) is (seed 0, offset 1000) since only the sum is used."""
    a = load_dataset("lga_synthetic", None, None, 0)
    b = load_dataset("lga_synthetic", None, None, 0)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    c = load_dataset("lga_synthetic", None, None, 1)
    assert not np.array_equal(a.x_train, c.x_train) and not np.array_equal(a.y_train, c.y_train)
    d = load_dataset("lga_synthetic", build("lga_synthetic", {"seed_offset": 999}), None, 1)
    assert np.array_equal(a.x_train, d.x_train) and np.array_equal(a.x_test, d.x_test)


def test_D3_lga_synthetic_recipe():
    """Recompute the first training and the first test sample from default_rng(1000 + seed) in the
    sanity script's draw order (means, mixing matrix, train labels, train noise, then the test set):
    x = tanh(z W) + 0.1 z with z = mu[y] + 1.2 n. Agreement to float32 rounding proves the order,
    the scales (1/sqrt(d) on W, 1.2 on the noise) and that the test set comes after the train set."""
    seed = 3
    ds = load_dataset("lga_synthetic", None, None, seed)
    rng = np.random.default_rng(1000 + seed)
    mu = rng.normal(0, 1.0, (10, 32))
    w = rng.normal(0, 1.0, (32, 32)) / np.sqrt(32)
    sample = []
    for n in (4000, 2000):
        y = rng.integers(0, 10, n)
        z = mu[y[0]] + rng.normal(0, 1.2, (n, 32))[0]
        sample.append((y[0], np.tanh(z @ w) + 0.1 * z))
    (y_tr, x_tr), (y_te, x_te) = sample
    assert ds.y_train[0] == y_tr and ds.y_test[0] == y_te
    np.testing.assert_allclose(ds.x_train[0], x_tr, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ds.x_test[0], x_te, rtol=0, atol=1e-6)
    # the 0.1 z skip term keeps x informative beyond tanh's range (|tanh| < 1)
    assert np.abs(ds.x_train).max() > 1.0
