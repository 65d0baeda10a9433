"""``hpcfl bench``: both sides do the same SGD work, and the figures it prints are its JSON's."""

import json

import pytest
from clirun import hpcfl

from hpcfl.bench import _layouts, checkpoint_line, median_run, pair_ratios, round_ratios, summarize
from hpcfl.errors import ConfigError

TINY = ["--set", "data.synthetic_images.num_train=640", "--set", "data.synthetic_images.num_test=100",
        "--set", "data.num_clients=10", "--set", "algorithm.clients_per_round=4", "--set", "data.cache=off"]


@pytest.mark.parametrize("layout", ["1x1", "2x1"])
def test_bench_runs_both_sides_on_the_same_work(tmp_path, layout):
    p = hpcfl("bench", "W", "--rounds", "3", "--layout", layout, "--out", str(tmp_path), *TINY, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = layout[0]
    hp = json.loads((tmp_path / f"W_hpcfl_{layout}.json").read_text())
    bare = json.loads((tmp_path / f"W_bare_{layout}.json").read_text())
    # the same cohorts and one local epoch of batch 32 each: identical step counts, round by round
    assert hp["total_steps"] == bare["total_steps"] > 0
    assert [row["steps"] for row in hp["rounds"]] == [row["steps"] for row in bare["rounds"]]   # every rank's
    assert len(hp["peak_rss_mb"]) == len(bare["peak_rss_mb"]) == int(r)
    assert hp["dealt"] is (r == "2")                    # FedAvg is dealt by work on several ranks
    summary = json.loads((tmp_path / "W_summary.json").read_text())[0]
    ratio = summary["hpcfl"]["s_per_round"] / summary["bare"]["s_per_round"]
    assert summary["ratio"] == pytest.approx(ratio)
    assert f"ratio hpcfl / bare (s per round): {ratio:.3f}x" in p.stdout
    assert "steps/s" in p.stdout and "start-up" in p.stdout and "MB/rank" in p.stdout
    ck = hp["checkpoint"]                   # one checkpoint of the engine's state, written and read back
    assert ck["rows_mb"] == 0 and 62_006 * 4 / 2**20 < ck["state_mb"] < ck["file_mb"]   # FedAvg: LeNet-5 + grid
    assert checkpoint_line(ck) in p.stdout


def test_checkpoint_line_by_hand():
    c = {"state_mb": 1000.04, "rows_mb": 990.0, "file_mb": 1000.2, "rss_save_mb": 1300.4, "save_s": 2.5,
         "peak_save_mb": 1400.0, "rss_load_mb": 1301.0, "load_s": 1.25, "peak_load_mb": None}
    assert checkpoint_line(c) == ("  checkpoint: state 1000.0 MB (990.0 MB of per-client rows), file 1000.2 MB; "
                                  "rank 0 from 1300 MB RSS: save 2.50 s, peak 1400 MB (+100); load 1.25 s, "
                                  "peak unknown")


def test_summary_by_hand():
    fig = {"side": "hpcfl", "startup_s": 1.5, "peak_rss_mb": [100.0, 120.0], "total_steps": 30,
           "rounds": [{"round_s": 9.0, "train": 8.0, "reduce": 1.0, "steps": 10, "accuracy": 0.1},
                      {"round_s": 2.0, "train": 1.5, "reduce": 0.5, "steps": 8, "accuracy": 0.2},
                      {"round_s": 4.0, "train": 3.0, "reduce": 1.0, "steps": 12, "accuracy": 0.3}]}
    s = summarize(fig)
    assert s["s_per_round"] == 3.0                        # rounds 2 and 3: (2 + 4) / 2
    assert s["phases"] == {"train": 2.25, "reduce": 0.75}
    assert s["steps_per_s"] == 20 / 6                     # 8 + 12 steps in 6 s
    assert s["peak_rss_mb"] == 120.0 and s["accuracy"] == 0.3
    bare = dict(fig, side="bare")                         # the bare loop's rows hold every rank's steps too
    assert summarize(bare)["steps_per_s"] == 20 / 6


def test_layouts_default_and_errors():
    assert _layouts(None, 2) == [(1, 2), (2, 1)]
    assert _layouts(None, 1) == [(1, 1)]
    assert _layouts(["2x1", "1X4"], 8) == [(2, 1), (1, 4)]
    for bad in ("2", "0x1", "ax1"):
        with pytest.raises(ConfigError, match="RANKSxTHREADS"):
            _layouts([bad], 2)


def test_unknown_workload_is_refused_by_the_parser():
    p = hpcfl("bench", "nope")
    assert p.returncode == 2 and "invalid choice: 'nope'" in p.stderr


def test_repeated_pairs_give_the_median_ratio_by_hand():
    h = [{"s_per_round": v} for v in (1.2, 1.0, 1.1)]
    b = [{"s_per_round": v} for v in (1.0, 1.0, 0.5)]
    got = pair_ratios(h, b)
    assert got["ratios"] == [1.2, 1.0, 2.2] and got["ratio"] == 1.2    # pairs, not medians of each side
    assert median_run(h)["s_per_round"] == 1.1
    assert median_run(h[:2])["s_per_round"] == 1.0                      # even count: the lower middle run
    assert pair_ratios(h[:2], b[:2])["ratio"] == pytest.approx(1.1)


def test_repeat_alternates_the_sides_and_prints_the_median_pair_ratio(tmp_path):
    p = hpcfl("bench", "W", "--rounds", "2", "--layout", "1x1", "--repeat", "2", "--out", str(tmp_path), *TINY,
              timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    order = [line.split()[1] for line in p.stdout.splitlines() if line.strip().startswith("running")]
    assert order == ["hpcfl", "bare", "bare", "hpcfl"]
    runs = {side: [summarize(json.loads((tmp_path / f"W_{side}_1x1_r{i}.json").read_text())) for i in (1, 2)]
            for side in ("hpcfl", "bare")}
    want = pair_ratios(runs["hpcfl"], runs["bare"])
    summary = json.loads((tmp_path / "W_summary.json").read_text())[0]
    assert summary["ratios"] == pytest.approx(want["ratios"]) and summary["ratio"] == pytest.approx(want["ratio"])
    assert f"ratio hpcfl / bare (s per round): {want['ratio']:.3f}x" in p.stdout
    assert "median of 2 pairs, range" in p.stdout and "(median of 2 runs each)" in p.stdout
    assert hpcfl("bench", "W", "--repeat", "0").returncode == 2


def test_round_ratios_by_hand():
    h = [{"rounds": [{"round_s": 9.0}, {"round_s": 1.2}, {"round_s": 1.0}]}, {"rounds": [{"round_s": 5.0}, {"round_s": 3.0}]}]
    b = [{"rounds": [{"round_s": 1.0}, {"round_s": 1.0}, {"round_s": 0.5}]}, {"rounds": [{"round_s": 5.0}, {"round_s": 2.0}]}]
    got = round_ratios(h, b)
    assert got["ratios"] == [1.2, 2.0, 1.5] and got["ratio"] == 1.5    # round 1 of each run left out
    assert got["total_ratio"] == pytest.approx(5.2 / 3.5)


@pytest.mark.parametrize("layout", ["1x1", "2x1"])
def test_interleave_runs_both_sides_in_one_process_round_by_round(tmp_path, layout):
    """One process set per layout; the two sides' rounds are the same cohorts and steps, and the
    printed ratio is the median of the per-round ratios of the JSON."""
    p = hpcfl("bench", "W", "--rounds", "3", "--layout", layout, "--interleave", "--bare-layers", "zoo",
              "--out", str(tmp_path), *TINY, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    order = [line.split()[1] for line in p.stdout.splitlines() if line.strip().startswith("running")]
    assert order == ["both"]
    fig = json.loads((tmp_path / f"W_both_{layout}.json").read_text())
    assert [r["steps"] for r in fig["hpcfl"]["rounds"]] == [r["steps"] for r in fig["bare"]["rounds"]]
    assert sum(r["steps"] for r in fig["bare"]["rounds"]) > 0 and len(fig["bare"]["rounds"]) == 3
    want = round_ratios([fig["hpcfl"]], [fig["bare"]])
    assert len(want["ratios"]) == 2
    assert f"ratio hpcfl / bare (s per round): {want['ratio']:.3f}x" in p.stdout
    assert "median of 2 interleaved rounds" in p.stdout and "bare model with zoo layers" in p.stdout
    assert f"total time of those rounds {want['total_ratio']:.3f}x" in p.stdout
    bad = hpcfl("bench", "W", "--interleave", "--only", "bare")
    assert bad.returncode == 2 and "drop --only bare" in bad.stderr
