"""hpcfl.analysis.plots and hpcfl.cli.plot (curves, client heatmap, CLI) and preview.heatmap_png(log=True).

The results files are written with ResultsWriter from hand-chosen values: no training.
Fixture runs: 4 clients; round r's cohort is clients {(r-1) % 4, r % 4}; client i runs
10 r + i local steps in round r. Group "lr=0.1" has seeds 0 (3 rounds, no evaluation in
round 1) and 1 (4 rounds); group "lr=0.01" has seeds 0 and 1 (3 rounds, no [system]).
"""

from pathlib import Path

import numpy as np
import pytest

from hpcfl.analysis import plots
from hpcfl.data.preview import heatmap_png
from hpcfl.errors import HpcflError
from hpcfl.io.results import FinalModel, CLIENT_FIELDS, METRICS, ResultsWriter
from hpcfl.results import load

MODEL = FinalModel(["param:w"], [(2,)], "float64")   # /final's layout

NAN = np.nan
# the min..max bands of groups 0 and 1: C0 (#1f77b4) and C1 (#ff7f0e) at alpha 0.15 over white
BAND_C0 = tuple(1 - 0.15 * (1 - np.array([0x1F, 0x77, 0xB4]) / 255))
BAND_C1 = tuple(1 - 0.15 * (1 - np.array([0xFF, 0x7F, 0x0E]) / 255))
COUNTS = np.array([[5, 0], [3, 3], [0, 4], [10, 1]])
RUNS = {   # (lr, seed): test_accuracy, train_loss, sim_time per round
    (0.1, 0): ([NAN, 0.6, 0.7], [2.0, 1.5, 1.0], [1.0, 2.0, 3.0]),
    (0.1, 1): ([0.3, 0.4, 0.9, 0.95], [2.2, 1.4, 1.1, 0.9], [2.0, 4.0, 6.0, 8.0]),
    (0.01, 0): ([0.2, 0.25, 0.3], [2.5, 2.4, 2.3], [0.0, 0.0, 0.0]),
    (0.01, 1): ([0.1, 0.2, 0.35], [2.6, 2.5, 2.2], [0.0, 0.0, 0.0]),
}


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)


def cohort(r):
    return np.array(sorted({(r - 1) % 4, r % 4}))


def write_run(out: Path, lr, seed, acc, loss, sim, test_loss=None) -> Path:
    """A results file with the given per-round metrics; other fields 0 (or NaN for evaluations)."""
    out.mkdir(parents=True, exist_ok=True)
    config = {"run": {"name": f"lr{lr}_s{seed}", "seed": seed, "rounds": len(acc)},
              "data": {"dataset": "digits", "num_clients": 4}, "algorithm": {"name": "fedavg", "lr": lr}}
    w = ResultsWriter(out / "results.h5", {"config": config, "run_id": f"{seed:032x}", "seed": seed}, COUNTS, model=MODEL)
    for i, r in enumerate(range(1, len(acc) + 1)):
        m = {k: 0 for k in METRICS} | {"round": r, "test_accuracy": acc[i], "train_loss": loss[i],
                                       "sim_time": sim[i], "lr": lr, "global_train_loss": NAN,
                                       "global_train_accuracy": NAN,
                                       "test_loss": NAN if test_loss is None else test_loss[i]}
        ids = cohort(r)
        c = {k: np.zeros(ids.size) for k in CLIENT_FIELDS} | {
            "round": np.full(ids.size, r), "client": ids, "steps": 10 * r + ids,
            "weight": np.full(ids.size, 0.5), "train_loss": np.full(ids.size, loss[i])}
        if r == 2:
            c["train_loss"][0] = NAN   # client 1 trained nothing in round 2
        w.append_round(m, c)
    w.write_final(np.zeros(2))
    w.close()
    return out


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {key: write_run(root / f"lr{key[0]}_s{key[1]}", *key, *vals) for key, vals in RUNS.items()}


@pytest.fixture(scope="module")
def groups(run_dirs):
    return {f"lr={lr}": [load(run_dirs[(lr, s)]) for s in (0, 1)] for lr in (0.1, 0.01)}


def read_png(path):
    import matplotlib.image as mpimg

    return mpimg.imread(path)


def count_colour(img, rgb, tol=1.5 / 255):
    """Pixels whose RGB is within ``tol`` of ``rgb`` (0..1 floats)."""
    return int((np.abs(img[..., :3] - np.asarray(rgb)) <= tol).all(axis=-1).sum())


def distinct_colours(img):
    return len(np.unique((img[..., :3] * 255).round().astype(np.int64) @ np.array([65536, 256, 1])))


# ----------------------------------------------------------------------------- curves

def test_group_curve_aligns_runs_of_different_length(groups):
    c = plots.group_curve(groups["lr=0.1"], "test_accuracy")
    np.testing.assert_array_equal(c.rounds, [1, 2, 3, 4])
    np.testing.assert_allclose(c.mean, [0.3, 0.5, 0.8, 0.95])
    np.testing.assert_array_equal(c.full, [False, True, True, False])   # round 1: seed 0 not evaluated
    np.testing.assert_allclose(c.lo[c.full], [0.4, 0.7])
    np.testing.assert_allclose(c.hi[c.full], [0.6, 0.9])
    assert c.runs == 2


def test_group_curve_sim_time_is_mean_clock_of_runs_with_a_value(groups):
    c = plots.group_curve(groups["lr=0.1"], "test_accuracy", x="sim_time")
    np.testing.assert_allclose(c.x, [2.0, 3.0, 4.5, 8.0])
    c = plots.group_curve(groups["lr=0.1"], "train_loss", x="sim_time")
    np.testing.assert_allclose(c.x, [1.5, 3.0, 4.5, 8.0])
    np.testing.assert_allclose(c.mean, [2.1, 1.45, 1.05, 0.9])


def test_quality_is_loss_without_accuracy(tmp_path, groups):
    assert plots.quality_metric(groups["lr=0.1"])[0] == "test_accuracy"
    quad = load(write_run(tmp_path / "q", 0.1, 0, [NAN] * 2, [3.0, 2.0], [0.0, 0.0], test_loss=[4.0, 1.0]))
    name, label = plots.quality_metric([quad])
    assert (name, label) == ("test_loss", "test loss (lower is better)")
    np.testing.assert_allclose(plots.group_curve([quad], name).mean, [4.0, 1.0])


def test_curves_png_size_band_and_content(tmp_path, groups):
    path = plots.curves_png(groups, tmp_path / "c.png", size=(641, 479))
    img = read_png(path)
    assert img.shape == (479, 641, 4)
    assert distinct_colours(img) > 200   # antialiased lines, text, two bands
    # min..max bands: C0 (#1f77b4) and C1 (#ff7f0e) at alpha 0.15 over white
    assert count_colour(img, BAND_C0) > 50
    assert count_colour(img, BAND_C1) > 50


def test_curves_png_single_runs_have_no_band(tmp_path, groups):
    one = {"a": groups["lr=0.1"][:1], "b": groups["lr=0.01"][:1]}
    img = read_png(plots.curves_png(one, tmp_path / "c1.png", metrics=("quality",), size=(400, 300)))
    assert img.shape == (300, 400, 4)
    assert count_colour(img, BAND_C0) < 10   # at most stray antialiased line pixels
    assert count_colour(img, (0.1216, 0.4667, 0.7059)) > 20   # the C0 line itself


def test_curves_sim_time(tmp_path, groups):
    img = read_png(plots.curves_png({"a": groups["lr=0.1"]}, tmp_path / "s.png", x="sim_time", size=(500, 400)))
    assert img.shape == (400, 500, 4)
    with pytest.raises(HpcflError, match=r"run lr0.01_s0: sim_time is 0 in every round: its job has no \[system\]"):
        plots.curves_png(groups, tmp_path / "s2.png", x="sim_time")
    assert not (tmp_path / "s2.png").exists()


def test_curves_unknown_metric_and_bad_path(tmp_path, groups):
    with pytest.raises(HpcflError, match="no metric 'acc'; available: quality, clients_participating"):
        plots.curves_png(groups, tmp_path / "m.png", metrics=("acc",))
    with pytest.raises(HpcflError, match="choose a path in a writable directory"):
        plots.curves_png(groups, tmp_path / "missing" / "m.png")


# ----------------------------------------------------------------------------- client heatmap

def test_client_matrix_places_cohort_members(groups):
    rows, rounds, values, member = plots.client_matrix(groups["lr=0.1"][0], "steps")
    np.testing.assert_array_equal(rows, [0, 1, 2, 3])
    np.testing.assert_array_equal(rounds, [1, 2, 3])
    np.testing.assert_array_equal(values.filled(NAN), [[10, NAN, NAN], [11, 21, NAN], [NAN, 22, 32],
                                                       [NAN, NAN, 33]])
    np.testing.assert_array_equal(member, ~np.isnan(values.filled(NAN)))
    _, _, loss, member = plots.client_matrix(groups["lr=0.1"][0], "train_loss")
    assert member[1, 1] and loss.mask[1, 1]    # in the cohort, no value: drawn grey
    assert loss[2, 1] == 1.5


def test_client_heatmap_png(tmp_path, groups):
    path = plots.client_heatmap_png(groups["lr=0.1"][1], "train_loss", tmp_path / "h.png", size=(700, 500))
    img = read_png(path)
    assert img.shape == (500, 700, 4)
    assert distinct_colours(img) > 50
    assert count_colour(img, (0.851, 0.851, 0.851)) > 100   # the grey "no value" cell (client 1, round 2)
    img = read_png(plots.client_heatmap_png(groups["lr=0.1"][1], "steps", tmp_path / "s.png", size=(300, 200)))
    assert img.shape == (200, 300, 4)


def test_client_heatmap_unknown_field_lists_fields(tmp_path, groups):
    with pytest.raises(HpcflError, match="unknown per-client field 'gsnr'; available: alast, anorm, anorm2, "
                                         "dropped, sim_time, steps, train_loss, weight"):
        plots.client_heatmap_png(groups["lr=0.1"][0], "gsnr", tmp_path / "x.png")


def test_client_unit_comes_from_the_file(groups):
    res = groups["lr=0.01"][0]
    assert plots._client_unit(res, "steps") == "steps" and plots._client_unit(res, "sim_time") == "s"


# ----------------------------------------------------------------------------- preview, log scale

def test_partition_heatmap_log_scale(tmp_path):
    counts = np.array([[1000, 0], [10, 100]])
    lin = read_png(heatmap_png(counts, str(tmp_path / "lin.png"), "skewed"))
    log = read_png(heatmap_png(counts, str(tmp_path / "log.png"), "skewed", log=True))
    assert lin.shape == log.shape
    # log10(10) / log10(1000) = 1/3 -> viridis(1/3) = (49, 104, 142): the whole cell in the log image,
    # only the colour bar's sliver in the linear one (10/1000 maps to almost viridis(0))
    teal = (49 / 255, 104 / 255, 142 / 255)
    assert count_colour(log, teal) > 2000 and count_colour(lin, teal) < 300
    white = (1.0, 1.0, 1.0)
    assert count_colour(log, white) - count_colour(lin, white) > 2000   # the zero cell is blank


# ----------------------------------------------------------------------------- CLI

def cli(argv):
    from hpcfl.cli import main

    return main(argv)


def test_cli_input_errors_exit_2(tmp_path, run_dirs, capsys):
    run = str(run_dirs[(0.1, 0)])
    assert cli(["plot", run, "--out", str(tmp_path / "a.png"), "--size", "12x8x"]) == 2
    assert "is not WIDTHxHEIGHT in pixels; use e.g. --size 1200x800" in capsys.readouterr().err
    assert cli(["plot", run, "--out", str(tmp_path / "a.png"), "--size", "50x800"]) == 2
    assert "each side must be 100..10000 pixels" in capsys.readouterr().err
    assert cli(["plot", run, "--out", str(tmp_path / "nodir" / "a.png")]) == 2
    assert "choose a path in a writable directory" in capsys.readouterr().err


def test_cli_curves_and_clients(tmp_path, run_dirs, capsys):
    runs = [str(p) for p in run_dirs.values()]
    out = tmp_path / "curves.png"
    assert cli(["plot", *runs, "--out", str(out), "--by", "algorithm.lr", "--size", "800x600"]) == 0
    assert read_png(out).shape == (600, 800, 4)
    assert count_colour(read_png(out), BAND_C0) > 50   # two seeds per group: a band
    out = tmp_path / "clients.png"
    assert cli(["plot", runs[0], "--out", str(out), "--kind", "clients", "--field", "weight"]) == 0
    assert read_png(out).shape == (800, 1200, 4)
    capsys.readouterr()
    assert cli(["plot", *runs[:2], "--out", str(out), "--kind", "clients"]) == 2
    assert "--kind clients plots one run, but 2 were found" in capsys.readouterr().err
    assert cli(["plot", runs[0], "--out", str(out), "--kind", "clients", "--field", "nope"]) == 2
    assert "unknown per-client field 'nope'; available:" in capsys.readouterr().err


# ----------------------------------------------------------------------------- figures for a paper

def svg_text(path) -> str:
    """The text a vector figure shows (fonts stay text: svg.fonttype = none)."""
    import re

    return " ".join(re.findall(r">([^<>]+)</text>", Path(path).read_text()))


def test_legend_and_caption_in_words(tmp_path, run_dirs):
    """Groups by lr, one entry each (line and band together, not one entry per band), in words,
    with the number of seeds; a caption with what the runs share; lines told apart by dashes
    and markers (greyscale), not colour alone."""
    from hpcfl.analysis.runs import group_keys, group_runs

    results = [load(p) for p in run_dirs.values()]
    groups, keys = group_runs(results, by=["lr"]), group_keys(results, by=["lr"])
    legend = plots.legend_words(groups, keys)
    assert list(legend.values()) == ["lr 0.1", "lr 0.01"]
    assert plots.caption_words(groups, keys) == "digits; 4 clients; FedAvg"   # run.rounds differs: left out
    path = plots.curves_png(groups, tmp_path / "c.svg", legend=legend, title="the caption")
    text = svg_text(path)
    assert text.count("lr 0.1 (2 seeds)") == 1 and text.count("lr 0.01 (2 seeds)") == 1, text
    assert "the caption" in text and "min..max" in text and "clients' mean mini-batch loss" in text
    assert Path(plots.curves_png(groups, tmp_path / "c.pdf")).read_bytes().startswith(b"%PDF")


def test_caption_names_every_shared_setting_off_its_default():
    """FedNova with E ~ U{1..5} and momentum 0.9 in every run: the caption says so (issue 38: it left
    out E ~ U{1..5}); a preset's own settings (FedNova's server rule) and bookkeeping are no difference."""
    from hpcfl import config
    from hpcfl.analysis import words
    from hpcfl.config import flatten

    cfg = config.load(Path(__file__).parents[2] / "jobs" / "quickstart.toml", [
        "algorithm.name=fednova", "algorithm.local_steps=0", "algorithm.steps=random_epochs",
        "algorithm.random_epochs.low=1", "algorithm.random_epochs.high=5", "algorithm.momentum=0.9",
        "runtime.threads=2", "run.seed=4"])
    flat = flatten(cfg.to_dict())
    assert words.caption(flat, set()) == ("digits; dirichlet (alpha = 0.5); 20 clients, 10 per round; mlp [64]; "
                                          "FedNova, lr 0.05, B = 16; momentum 0.9, E ~ U{1..5}, 30 rounds")
    # what differs between the runs is the legend's, not the caption's
    assert words.caption(flat, {"algorithm.momentum"}).endswith("B = 16; E ~ U{1..5}, 30 rounds")


def test_each_group_has_its_own_dash_and_marker():
    import matplotlib.figure

    ax = matplotlib.figure.Figure().subplots()
    curve = plots.Curve(np.arange(1, 41), np.arange(1.0, 41), np.ones(40), np.ones(40), np.ones(40),
                        np.ones(40, bool), 1)
    lines = [plots._draw_group(ax, curve, i) for i in range(3)]
    assert len({ln.get_linestyle() for ln in lines}) == 3 and len({ln.get_marker() for ln in lines}) == 3
    assert lines[0].get_markevery() == (0, 5) and lines[1].get_markevery() == (1, 5)   # 8 marks, staggered


def test_log_y_on_loss_panels_only(tmp_path, groups):
    text = svg_text(plots.curves_png(groups, tmp_path / "l.svg", metrics=("quality", "train_loss"), log_y=True))
    assert "train loss, log scale" in text and "test accuracy (fraction)" in text and "accuracy, log" not in text
    assert [plots._log_minor(v) for v in (0.2, 0.3, 0.4, 5.0, 70.0)] == ["0.2", "0.3", "", "5", ""]


def test_out_path_picks_the_format(tmp_path):
    for suffix in (".png", ".pdf", ".svg", ".PDF"):
        assert plots.check_out_path(tmp_path / f"f{suffix}")
    with pytest.raises(HpcflError, match=r"ending in \.png \(raster\), or \.pdf or \.svg"):
        plots.check_out_path(tmp_path / "f.jpg")


def test_words_of_config_keys():
    from hpcfl.analysis import words

    flat = {"algorithm.name": "fednova", "algorithm.steps": "random_epochs", "algorithm.random_epochs.low": 1,
            "algorithm.random_epochs.high": 5, "data.dirichlet.alpha": 0.1, "algorithm.mu": 0.01,
            "algorithm.weights": "disco", "model.mlp.hidden": [64, 32], "run.seed": 3}
    keys = ["algorithm.name", "algorithm.random_epochs.high", "algorithm.random_epochs.low", "algorithm.steps"]
    assert words.group_words(keys, flat) == "FedNova, E ~ U{1..5}"
    assert [words.key_words(k, flat) for k in ("data.dirichlet.alpha", "algorithm.mu", "algorithm.weights",
                                               "model.mlp.hidden", "run.seed")] == [
        "Dirichlet alpha = 0.1", "mu = 0.01", "FedDisco weights", "hidden = [64, 32]", "seed = 3"]
    assert words.partition_words("dirichlet", {"alpha": 0.5, "min_samples": 10, "max_tries": 100},
                                 {"alpha": 0.5, "min_samples": 10, "max_tries": 1000}) == \
        "dirichlet (alpha = 0.5, max_tries = 100)"


def test_client_heatmap_colours_integer_records_by_value(tmp_path, groups):
    """steps holds 10 r + i: 11, 20, 21, ... one colour each; its colour bar says "steps" once."""
    res = groups["lr=0.1"][1]
    _, _, values, _ = plots.client_matrix(res, "steps")
    from hpcfl.analysis.heatmap import levels

    found = levels(res, "steps", values)
    np.testing.assert_array_equal(found, np.unique(values.compressed()))
    assert levels(res, "train_loss", plots.client_matrix(res, "train_loss")[2]) is None   # floats: continuous
    text = svg_text(plots.client_heatmap_png(res, "steps", tmp_path / "s.svg", size=(600, 400)))
    assert "steps [steps]" not in text and " steps " in f" {text} "
    assert all(f"{v:g}" in text.split() for v in found[::max(1, int(np.ceil(found.size / 12)))])


def _drawn(monkeypatch):
    """The figures heatmap.save is given (each still open for inspection), in order."""
    from hpcfl.analysis import heatmap

    figs = []
    real = heatmap.save

    def keep(fig, path):
        figs.append(fig)
        return real(fig, path)

    monkeypatch.setattr(heatmap, "save", keep)
    return figs


def test_heatmap_colour_bar_ticks_sit_in_their_bands(tmp_path, groups, monkeypatch):
    """Integer records with unevenly spaced values (steps 11, 20, 21, ...): every tick at the middle of
    its value's band, one band per value (issue 38: the ticks missed the bands)."""
    figs = _drawn(monkeypatch)
    res = groups["lr=0.1"][1]
    from hpcfl.analysis.heatmap import levels

    found = levels(res, "steps", plots.client_matrix(res, "steps")[2])
    plots.client_heatmap_png(res, "steps", tmp_path / "s.png", size=(600, 400))
    bar = figs[-1].axes[-1]
    ticks = bar.get_yticks()
    labels = [t.get_text() for t in bar.get_yticklabels()]
    step = max(1, int(np.ceil(found.size / 12)))
    assert labels == [f"{v:g}" for v in found[::step]]
    lo, hi = bar.get_ylim()
    assert (lo, hi) == (-0.5, found.size - 0.5)                                  # one unit per band
    np.testing.assert_array_equal(ticks, np.arange(found.size)[::step])          # each at its band's centre


def test_heatmap_log_colour_scale(tmp_path, groups, monkeypatch, capsys):
    from matplotlib.colors import LogNorm

    figs = _drawn(monkeypatch)
    res = groups["lr=0.1"][1]
    plots.client_heatmap_png(res, "train_loss", tmp_path / "l.png", size=(600, 400), log=True)
    image = figs[-1].axes[0].images[-1]
    assert isinstance(image.norm, LogNorm) and "log scale" in figs[-1].axes[-1].get_ylabel()
    with pytest.raises(HpcflError, match="--log: dropped has values down to 0"):
        plots.client_heatmap_png(res, "dropped", tmp_path / "d.png", log=True)
