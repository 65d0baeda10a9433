"""preview.summary and preview.heatmap_png."""

import time

import numpy as np

from hpcfl.data import class_counts, make_partition
from hpcfl.data.partition import DirichletOptions
from hpcfl.data.preview import gini, heatmap_png, summary


def test_summary_small_lists_every_client():
    y = np.array([0, 0, 1, 1, 1, 2])
    parts = [np.array([0, 2]), np.array([1, 3, 4]), np.array([5])]
    text = summary(parts, y, 3)
    assert text.splitlines()[0] == "3 clients, 3 classes, 6 samples assigned of 6 (0 unused)"
    rows = [line.split() for line in text.splitlines()[2:5]]
    assert rows == [["0", "2", "1", "1", "0"], ["1", "3", "1", "2", "0"], ["2", "1", "0", "0", "1"]]
    assert "Gini of sizes" in text


def test_summary_large_gives_statistics_only():
    y = np.arange(6000) % 10
    parts = make_partition("iid", y, 300, None, 0)
    text = summary(parts, y, 10)
    assert len(text.splitlines()) < 10
    assert "size:               min 20  p25 20  median 20" in text
    assert "Gini of sizes: 0.000   empty clients: 0" in text


def test_gini():
    assert gini([5, 5, 5]) == 0.0
    assert abs(gini([0, 0, 0, 10]) - 0.75) < 1e-12


def test_heatmap_and_speed_on_w_workload(tmp_path):
    # workload W's labels (docs/workloads.md): the means are drawn first, then 50k uniform labels
    rng = np.random.default_rng(0)
    rng.standard_normal((10, 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, size=50000)
    t0 = time.perf_counter()
    parts = make_partition("dirichlet", y, 100, DirichletOptions(alpha=0.1), 0)
    text = summary(parts, y, 10)
    path = heatmap_png(class_counts(y, parts, 10), str(tmp_path / "h.png"), "Dirichlet(0.1)")
    assert time.perf_counter() - t0 < 10
    assert "100 clients" in text
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_heatmap_subsamples_huge(tmp_path):
    counts = np.random.default_rng(0).integers(0, 5, (20000, 10))
    path = heatmap_png(counts, str(tmp_path / "big.png"), "big")
    assert (tmp_path / "big.png").stat().st_size > 1000 and path.endswith("big.png")
