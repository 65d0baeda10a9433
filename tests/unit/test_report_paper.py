"""``hpcfl report``'s paper-ready comparisons (issue 49): precision, sweep order and --order,
labels that name the preset slots, paired differences to --baseline, --best-by and LaTeX.

Every expected number is worked out by hand (in the comments) from the curves written here.
"""

import json
import os
import re
import shutil
import subprocess

import pytest
from test_report import NAN, config, write_run

from hpcfl.analysis import latex
from hpcfl.analysis.precision import pm_text
from hpcfl.analysis.report import report_text
from hpcfl.errors import HpcflError
from hpcfl.io.sweeppoint import header, point_index

PRESET = {"fedavg": ("size", "average"), "fednova": ("size", "nova"), "feddisco": ("disco", "average"),
          "fedlga": ("uniform", "lga")}


def cfg(algorithm, seed, lr=0.1):
    """A resolved-looking config: the preset's weights and server slots filled, as a run writes them."""
    c = config(algorithm, seed, lr)
    c["algorithm"]["weights"], c["algorithm"]["server"] = PRESET[algorithm]
    return c


def table(text):
    """Text report -> {group label: {header: cell}} (columns split at two or more spaces)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = re.split(r"\s{2,}", lines[0])
    rows = {}
    for ln in lines[2:]:
        cells = re.split(r"\s{2,}", ln)
        if len(cells) != len(head):
            break   # the notes
        rows[cells[0]] = dict(zip(head, cells))
    return rows


# --------------------------------------------------------------------------- precision

@pytest.mark.parametrize("mean, std, want", [
    (0.8123, 0.0147, "0.812 ± 0.015"),
    (33.0, 3.2, "33.0 ± 3.2"),
    (19.3, 4.041, "19.3 ± 4.0"),
    (33.0, 12.3, "33 ± 12"),
    (333.0, 123.0, "330 ± 120"),      # two significant digits end at the tens
    (0.5, 0.0996, "0.50 ± 0.10"),      # 0.0996 rounds up to 0.10: two digits, not 0.100
    (0.7, 0.0, "0.7000 ± 0"),          # no spread: the column's own format
    (0.8 + 1e-16, 1.4e-16, "0.8000 ± 0"),   # float rounding of equal values is no spread
    (0.7, NAN, "0.7000"),              # one run: the mean alone
])
def test_precision_rules(mean, std, want):
    assert pm_text(mean, std, lambda v: f"{v:.4f}") == want


def test_signed_precision_never_writes_minus_zero():
    assert pm_text(0.012, 0.0041, str, sign=True) == "+0.0120 ± 0.0041"
    assert pm_text(-0.00001, 0.004, str, sign=True) == "0.0000 ± 0.0040"
    assert pm_text(-0.5, 0.25, str, sign=True) == "-0.50 ± 0.25"


# --------------------------------------------------------------------------- paired differences

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """FedAvg and FedLGA, seeds 0-2, four rounds each (last-2 = mean of rounds 3 and 4).

    fedavg finals 0.70, 0.72, 0.68, round 3 at 0.66; fedlga finals 0.73, 0.71, 0.74, round 3 at 0.70.
    """
    root = tmp_path_factory.mktemp("pair")
    for s, (fa, fl) in enumerate(((0.70, 0.73), (0.72, 0.71), (0.68, 0.74))):
        write_run(root / f"fedavg_seed-{s}", cfg("fedavg", s), [0.5, 0.6, 0.66, fa])
        write_run(root / f"fedlga_seed-{s}", cfg("fedlga", s), [0.4, 0.6, 0.70, fl])
    return root


def test_paired_difference_by_hand(pair):
    rows = table(report_text([pair], baseline="algorithm.name=fedavg", last_k=2))
    lga = rows["FedLGA (uniform weights)"]
    # final: d = 0.03, -0.01, 0.06; mean 0.08/3 = 0.02667; sample std sqrt(0.0024667/2) = 0.03512
    # -> std 0.035 (2 significant digits), mean to 3 decimals 0.027; better on seeds 0 and 2
    assert lga["Δ final vs FedAvg"] == "+0.027 ± 0.035 (2/3 better)"
    # last-2: d = (0.04 + d_final) / 2 = 0.035, 0.015, 0.05; mean 0.03333, std sqrt(0.00061667/2) = 0.01756
    assert lga["Δ last-2 vs FedAvg"] == "+0.033 ± 0.018 (3/3 better)"
    assert rows["FedAvg"]["Δ final vs FedAvg"] == "baseline"
    data = json.loads(report_text([pair], fmt="json", baseline="name=fedavg", last_k=2))
    p = data[1]["paired"]["final"]
    assert (p["n"], p["better"], p["worse"], p["seeds"]) == (3, 2, 1, [0, 1, 2])
    assert p["mean"] == pytest.approx(0.08 / 3) and p["std"] == pytest.approx(0.035119, abs=1e-6)
    assert data[0]["paired"] is None   # the baseline itself


def test_unmatched_seeds_are_named_and_left_out(pair, tmp_path):
    extra = write_run(tmp_path / "fedlga_seed-7", cfg("fedlga", 7), [0.9, 0.9, 0.9, 0.9])
    text = report_text([pair, extra], baseline="name=fedavg", last_k=2)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("warning: paired")]
    assert "seed 7 only in 'FedLGA (uniform weights)'" in line and "3 seed(s) matched" in line
    # the unmatched seed does not enter the difference: still the three matched seeds' figure
    assert table(text)["FedLGA (uniform weights)"]["Δ final vs FedAvg"] == "+0.027 ± 0.035 (2/3 better)"


# --------------------------------------------------------------------------- slots named in labels

def test_labels_name_the_preset_slots_that_differ(tmp_path):
    for a in ("fedavg", "fednova", "feddisco", "fedlga"):
        for s in range(2):
            write_run(tmp_path / f"{a}-{s}", cfg(a, s), [0.5, 0.6])
    text = report_text([tmp_path], order="fedavg,fednova,feddisco,fedlga")
    # FedNova's aggregation and FedDisco's weights are what those methods are: not repeated
    assert list(table(text)) == ["FedAvg", "FedNova", "FedDisco", "FedLGA (uniform weights)"]
    assert ("weights slot (set by each algorithm's preset, not in the grouping keys): FedDisco weights clients by "
            "size and label discrepancy; FedLGA weights clients uniformly; the others by size") in text
    assert "server slot" not in text   # every server that differs is its algorithm's own
    two = report_text([tmp_path / "fedavg-0", tmp_path / "fedlga-0"], fmt="markdown")
    assert "FedLGA weights clients uniformly; FedAvg by size." in two
    # the short label still names the group (--paper, --baseline, --order)
    assert "| 0.9 |" in report_text([tmp_path], fmt="markdown", paper=["FedLGA=0.9"])


def test_labels_name_every_option_that_changes_together(tmp_path):
    """The paper-exact FedLGA run beside the defaults differs in three options of one tier
    (algorithm.lga.*); the label names all three, not only the first in alphabetical order."""
    ours, exact = cfg("fedlga", 0), cfg("fedlga", 0)
    ours["algorithm"]["lga"] = {"variant": "C_pseudo", "grad_proxy": "avg_update"}
    exact["algorithm"]["lga"] = {"variant": "B_alg1", "grad_proxy": "full_grad", "alpha_min": -1e30}
    write_run(tmp_path / "ours", ours, [0.5, 0.6])
    write_run(tmp_path / "exact", exact, [0.5, 0.7])
    assert list(table(report_text([tmp_path / "ours", tmp_path / "exact"]))) == [
        "alpha_min unset, grad_proxy = avg_update, variant = C_pseudo",
        "alpha_min = -1e+30, grad_proxy = full_grad, variant = B_alg1"]
    # a key that follows from a shallower one is still left out: lr 0.1 is FedAvg's, 0.2 FedLGA's
    write_run(tmp_path / "a", cfg("fedavg", 0, lr=0.1), [0.5])
    write_run(tmp_path / "b", cfg("fedlga", 0, lr=0.2), [0.5])
    assert list(table(report_text([tmp_path / "a", tmp_path / "b"]))) == ["FedAvg", "FedLGA (uniform weights)"]


# --------------------------------------------------------------------------- order

def test_groups_come_in_sweep_order_not_alphabetically(tmp_path):
    """A grid ["fedlga", "fedavg"] x seeds 0-1: the point index on job.toml's first line orders them."""
    for i, (a, s) in enumerate((a, s) for a in ("fedlga", "fedavg") for s in range(2)):
        d = write_run(tmp_path / "sweep" / f"{a}_seed-{s}", cfg(a, s), [0.5])
        (d / "job.toml").write_text(f"# {header(i, 'grid.toml', f'--set algorithm.name={a}')}\n[run]\n")
    assert point_index(tmp_path / "sweep" / "fedavg_seed-1") == 3
    assert list(table(report_text([tmp_path / "sweep"]))) == ["FedLGA (uniform weights)", "FedAvg"]
    # old runs without the line: directory order within a PATH, PATH arguments in their order
    for a in ("fedavg", "fedlga"):
        write_run(tmp_path / "old" / a, cfg(a, 0), [0.5])
    assert list(table(report_text([tmp_path / "old"]))) == ["FedAvg", "FedLGA (uniform weights)"]
    later_first = report_text([tmp_path / "old" / "fedlga", tmp_path / "old" / "fedavg"])
    assert list(table(later_first)) == ["FedLGA (uniform weights)", "FedAvg"]


def test_the_sweep_writes_the_index_the_report_reads(tmp_path):
    from hpcfl.cli import sweep as S

    sw = S.expand("jobs/sweep_quickstart.toml", out=tmp_path, check=False)
    S.write_point_job(sw, sw.points[4])
    assert point_index(tmp_path / sw.points[4].name) == 4 and sw.points[4].name == "fednova_seed-1"
    assert point_index(tmp_path) is None
    import os

    os.mkfifo(tmp_path / "fifo-job.toml")   # planted: opening it for reading would wait for a writer
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "job.toml").symlink_to(tmp_path / "fifo-job.toml")
    assert point_index(tmp_path / "f") is None


def test_order_option(tmp_path):
    for a in ("fedavg", "fednova", "fedlga"):
        for lr in (0.1, 0.01):
            write_run(tmp_path / f"{a}-{lr}", cfg(a, 0, lr), [0.5])
    text = report_text([tmp_path], order="fedlga,name=fedavg")
    labels = list(table(text))
    # one note for FedLGA at either lr; FedAvg and FedNova, both by size, are "the others"
    assert text.count("weights clients uniformly") == 1 and "FedLGA weights clients uniformly; the others by size" \
        in text
    # every FedLGA group, then every FedAvg one, then the rest; each in directory order (fedavg-0.01 first)
    assert labels == ["FedLGA, lr 0.01 (uniform weights)", "FedLGA, lr 0.1 (uniform weights)",
                      "FedAvg, lr 0.01", "FedAvg, lr 0.1", "FedNova, lr 0.01", "FedNova, lr 0.1"]
    # one grouping key: sorted by its value, ties kept in directory order
    assert list(table(report_text([tmp_path], order="lr"))) == [
        "FedAvg, lr 0.01", "FedLGA, lr 0.01 (uniform weights)", "FedNova, lr 0.01",
        "FedAvg, lr 0.1", "FedLGA, lr 0.1 (uniform weights)", "FedNova, lr 0.1"]
    with pytest.raises(HpcflError, match="'fedprox' names no group"):
        report_text([tmp_path], order="fedlga,fedprox")


# --------------------------------------------------------------------------- best value of a grid

@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """FedAvg and FedLGA x lr {0.1, 0.01} x seeds 0-2; curves [0.5, final]. Finals by seed:

    fedavg lr 0.1: 0.60 0.80 0.82 (mean 0.74)   fedavg lr 0.01: 0.70 0.72 0.74 (mean 0.72)
    fedlga lr 0.1: 0.65 0.66 0.67 (mean 0.66)   fedlga lr 0.01: 0.75 0.76 0.77 (mean 0.76)
    """
    root = tmp_path_factory.mktemp("grid")
    finals = {("fedavg", 0.1): (0.60, 0.80, 0.82), ("fedavg", 0.01): (0.70, 0.72, 0.74),
              ("fedlga", 0.1): (0.65, 0.66, 0.67), ("fedlga", 0.01): (0.75, 0.76, 0.77)}
    for (a, lr), fs in finals.items():
        for s, f in enumerate(fs):
            write_run(root / f"{a}_lr-{lr}_seed-{s}", cfg(a, s, lr), [0.5, f])
    return root


def test_best_by_on_all_seeds_by_hand(grid):
    text = report_text([grid], best_by="algorithm.lr", criterion="final")
    rows = table(text)
    # fedavg: 0.74 > 0.72 -> lr 0.1; fedlga: 0.76 > 0.66 -> lr 0.01
    assert list(rows) == ["FedAvg, lr 0.1", "FedLGA, lr 0.01 (uniform weights)"]
    # 0.60, 0.80, 0.82: std sqrt(0.0296 / 2) = 0.1217 -> 0.12; 0.75..0.77: std 0.010
    assert rows["FedAvg, lr 0.1"]["final acc"] == "0.74 ± 0.12"
    assert rows["FedLGA, lr 0.01 (uniform weights)"]["final acc"] == "0.760 ± 0.010"
    assert rows["FedAvg, lr 0.1"]["n"] == "3"
    assert "FedAvg: lr 0.01 -> 0.7200 (n=3), 0.1 -> 0.7400 (n=3) chosen" in text
    assert "the choice saw the numbers reported" in text


def test_best_by_held_out_seeds_by_hand(grid):
    text = report_text([grid], best_by="lr", criterion="final", select_seeds="0", baseline="name=fedavg")
    rows = table(text)
    # seed 0 alone chooses: fedavg 0.70 > 0.60 -> lr 0.01; fedlga 0.75 > 0.65 -> lr 0.01
    assert list(rows) == ["FedAvg, lr 0.01", "FedLGA, lr 0.01 (uniform weights)"]
    avg, lga = rows["FedAvg, lr 0.01"], rows["FedLGA, lr 0.01 (uniform weights)"]
    # reported on seeds 1 and 2 only: 0.72, 0.74 -> 0.730 ± 0.014; 0.76, 0.77 -> 0.7650 ± 0.0071
    assert (avg["n"], avg["final acc"]) == ("2", "0.730 ± 0.014")
    assert (lga["n"], lga["final acc"]) == ("2", "0.7650 ± 0.0071")
    # paired on seeds 1, 2: d = 0.04, 0.03 -> 0.035 ± 0.0071, both better
    assert lga["Δ final vs FedAvg, lr 0.01"] == "+0.0350 ± 0.0071 (2/2 better)"
    assert "over seed(s) 0 only; the table shows the other seeds" in text
    with pytest.raises(HpcflError, match="none is left to report"):
        report_text([grid], best_by="lr", select_seeds="0,1,2")


def test_best_by_keeps_the_grid_apart_under_by(grid):
    text = report_text([grid], by=["algorithm.name"], best_by="lr", criterion="final")
    assert list(table(text)) == ["FedAvg, lr 0.1", "FedLGA, lr 0.01 (uniform weights)"]


# --------------------------------------------------------------------------- LaTeX

def test_latex_escapes_special_characters():
    assert latex.escape("a_b 5% & #1 $x {y} ~^\\") == (r"a\_b 5\% \& \#1 \$x \{y\} \textasciitilde{}"
                                                       r"\textasciicircum{}\textbackslash{}")
    assert latex.escape("0.70 ± 0.10") == r"0.70 $\pm$ 0.10"


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """Two models whose names hold LaTeX's special characters, two seeds each, all finished."""
    root = tmp_path_factory.mktemp("odd")
    for m in ("mlp_1%", "cnn&#2"):
        for s in range(2):
            write_run(root / f"{m.replace('%', 'p').replace('&', 'a').replace('#', 'h')}-{s}", config("fedavg", s,
                      model=m), [0.5, 0.6 + 0.01 * s])
    return root


def test_latex_table_structure(odd):
    text = report_text([odd], fmt="latex", baseline="model.name=mlp_1%", paper=["cnn&#2=0.5"])
    lines = text.splitlines()
    spec = re.search(r"\\begin\{tabular\}\{([lr]+)\}", text).group(1)
    i, j = lines.index(r"    \toprule"), lines.index(r"    \bottomrule")
    assert lines[i + 2] == r"    \midrule" and r"\end{tabular}" in lines[j + 1]
    body = [lines[i + 1]] + lines[i + 3:j]
    assert len(body) == 3 and all(row.endswith(r" \\") for row in body)
    assert {len(row.split(" & ")) for row in body} == {len(spec)}   # every row as many cells as columns
    assert r"mlp\_1\%" in text and r"cnn\&\#2" in text and r"$\pm$" in text and "±" not in text
    assert r"$\Delta$ final vs mlp\_1\%" in body[0]
    # every run finished after 2 rounds: no status or rounds column, the caption says so
    assert "status" not in body[0] and r"\caption{every run finished; 2 rounds each;" in text


# CI installs pdflatex and sets HPCFL_REQUIRE_PDFLATEX=1: there a missing pdflatex fails instead of skipping
@pytest.mark.skipif(shutil.which("pdflatex") is None and not os.environ.get("HPCFL_REQUIRE_PDFLATEX"),
                    reason="pdflatex is not installed (apt-get install texlive-latex-base texlive-latex-recommended)")
def test_latex_table_compiles(odd, tmp_path):
    (tmp_path / "table.tex").write_text(report_text([odd], fmt="latex", baseline="model.name=mlp_1%", per_run=True))
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
                                      "\\input{table}\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], check=False,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 1000


def test_cli_options(grid, capsys):
    from hpcfl import cli

    args = ["report", str(grid), "--best-by", "lr", "--criterion", "final", "--select-seeds", "0", "--baseline",
            "name=fedavg", "--order", "fedlga", "--format", "latex"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    rows = [line.split(" & ")[0].strip() for line in out.splitlines() if " & " in line][1:]
    assert r"\toprule" in out and rows == ["FedLGA, lr 0.01 (uniform weights)", "FedAvg, lr 0.01"]
    assert r"+0.0350 $\pm$ 0.0071 (2/2 better)" in out
    assert cli.main(["report", str(grid), "--order", "fedprox"]) == 2
    assert "'fedprox' names no group" in capsys.readouterr().err
    with pytest.raises(SystemExit):   # argparse's own refusal of a criterion it does not list
        cli.main(["report", str(grid), "--best-by", "lr", "--criterion", "worst"])
    assert "invalid choice: 'worst'" in capsys.readouterr().err
