"""Per-client evaluation at the global model (run.eval_clients, /client_eval): the held-out rows,
a hand check on a two-client job, the switch, resume, the report's columns and the fairness plot."""

import h5py
import numpy as np
import pytest
from runner import job, run_memory
from test_client_eval_draw import class_quota, client_test_sets

from hpcfl import cli, config, data
from hpcfl.analysis.fairness import fairness
from hpcfl.analysis.report import report_text
from hpcfl.config.tomltext import toml_document
from hpcfl.errors import HpcflError
from hpcfl.io.results import ResultsWriter
from hpcfl.results import load


def test_quota_splits_by_largest_remainder_and_caps_at_the_test_set():
    # 5 rows over counts 3:1:0 -> 3.75, 1.25, 0: floors 3, 1, the one left to the largest remainder (class 0)
    assert class_quota(np.array([3, 1, 0]), 5, np.array([10, 10, 10])).tolist() == [4, 1, 0]
    # ties go to the lower class: 3 rows over 1:1 -> 1.5, 1.5 -> 2, 1
    assert class_quota(np.array([1, 1]), 3, np.array([9, 9])).tolist() == [2, 1]
    # a class the test set lacks gets none, its share goes to the others; no class gets more than it has
    assert class_quota(np.array([2, 2, 4]), 8, np.array([0, 10, 3])).tolist() == [0, 3, 3]


def test_rows_have_the_clients_label_mix_and_are_keyed_by_seed_and_client():
    y = np.repeat(np.arange(3), 100)                     # 100 test samples per class
    counts = np.array([[30, 10, 0], [0, 0, 20], [5, 5, 30]])   # n_train = 100, n_test = 300: m_i = 3 n_i
    off, rows = client_test_sets(y, counts, seed=4, min_size=10)
    assert np.diff(off).tolist() == [120, 60, 120]
    got = [np.bincount(y[rows[off[i]:off[i + 1]]], minlength=3).tolist() for i in range(3)]
    assert got == [[90, 30, 0], [0, 0, 60], [15, 15, 90]]
    for i in range(3):
        r = rows[off[i]:off[i + 1]]
        assert np.all(np.diff(r) > 0)                    # sorted, no repeat within a client
    # client 1's rows depend on (seed, client) only: the same after the other clients change
    off2, rows2 = client_test_sets(y, np.array([[1, 0, 29], [0, 0, 20], [50, 0, 0]]), seed=4, min_size=60)
    assert rows2[off2[1]:off2[2]].tolist() == rows[off[1]:off[2]].tolist()
    off3, rows3 = client_test_sets(y, counts, seed=5, min_size=10)
    assert rows3.tolist() != rows.tolist()
    # the floor: a client with 1 training sample still gets min_size rows
    off4, _ = client_test_sets(y, np.array([[1, 0, 0], [99, 0, 0]]), seed=0, min_size=10)
    assert np.diff(off4).tolist() == [10, 100]


def test_fairness_statistics_by_hand():
    f = fairness([0.5, 1.0, np.nan])                     # NaN (a client without rows) left out
    assert f == {"mean": 0.75, "worst10": 0.5, "std": 0.25, "jain": pytest.approx(1.5 ** 2 / (2 * 1.25))}
    f = fairness(np.arange(1, 21) / 20)                  # worst 10 % of 20 clients: the 2 lowest
    assert f["worst10"] == pytest.approx(0.075) and f["jain"] == pytest.approx(10.5 ** 2 * 20 / 2870)


TWO = {
    "run": {"name": "two", "seed": 2, "rounds": 3, "eval_every": 1},
    "data": {"dataset": "digits", "partition": "dirichlet", "num_clients": 2, "dirichlet": {"alpha": 0.3}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg", "lr": 0.1, "batch_size": 16, "local_steps": 5},
    "runtime": {"threads": 1, "progress": "none", "dtype": "float64", "eval_batch_size": 50},
}


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """A two-client softmax regression in float64, run through hpcfl run."""
    d = tmp_path_factory.mktemp("two")
    (d / "job.toml").write_text(toml_document(TWO, "two clients"))
    assert cli.main(["run", str(d / "job.toml"), "--out", str(d / "run")]) == 0
    return d / "run"


def test_two_client_job_by_hand(two):
    """The last round's per-client accuracy and loss, recomputed in numpy from the final weights on
    each client's held-out rows (a fresh draw of those rows from the stored label counts)."""
    res = load(two)
    cfg = config.from_dict(res.config)
    ds = data.load_dataset("digits", cfg.dataset_options, None, cfg.run.seed)
    w = res.state_dict()
    W, b = w["fc.weight"].numpy(), w["fc.bias"].numpy()
    logits = ds.x_test.reshape(len(ds.y_test), -1).astype(np.float64) @ W.T + b
    z = logits - logits.max(axis=1, keepdims=True)
    nll = np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(z)), ds.y_test]
    hit = logits.argmax(axis=1) == ds.y_test
    off, rows = client_test_sets(ds.y_test, res.class_counts, cfg.run.seed, cfg.run.eval_clients_min)
    ce = res.client_eval
    last = ce["round"] == 3
    assert ce["client"][last].tolist() == [0, 1] and ce["samples"][last].tolist() == np.diff(off).tolist()
    # the rows follow each client's own label mix: the two clients' rows differ in their classes
    mixes = [np.bincount(ds.y_test[rows[off[i]:off[i + 1]]], minlength=10) for i in range(2)]
    assert not np.array_equal(mixes[0] / mixes[0].sum(), mixes[1] / mixes[1].sum())
    for i in range(2):
        r = rows[off[i]:off[i + 1]]
        assert ce["accuracy"][last][i] == pytest.approx(hit[r].mean(), abs=1e-12)
        assert ce["loss"][last][i] == pytest.approx(nll[r].mean(), rel=1e-10)
    # the whole test set, the same model: the run's own test accuracy
    assert res.metrics["test_accuracy"][-1] == pytest.approx(hit.mean(), abs=1e-12)
    assert sorted(set(ce["round"].tolist())) == [1, 2, 3] and len(ce["round"]) == 6


def test_report_shows_the_clients_fairness_columns(two):
    res = load(two)
    acc = res.client_eval["accuracy"][res.client_eval["round"] == 3]
    f = fairness(acc)
    text = report_text([two])
    head, _, row = text.splitlines()[:3]
    cells = dict(zip(["group", "n", "final acc", "best acc", "best round", "last-5 acc", "client acc", "worst 10%",
                      "client std", "Jain", "rounds", "status"], row.split()))
    assert "client acc" in head and "Jain" in head
    assert cells["client acc"] == f"{f['mean']:.4f}" and cells["worst 10%"] == f"{min(acc):.4f}"   # 1 of 2
    assert cells["Jain"] == f"{(acc.sum() ** 2 / (2 * (acc ** 2).sum())):.4f}"
    assert "Jain's index" in text


def test_the_switch_turns_it_off_without_changing_anything_else(tmp_path):
    x_on, m_on, c_on = run_memory(job(), __import__("mpi4py").MPI.COMM_SELF)
    x_off, m_off, c_off = run_memory(job(**{"run.eval_clients": False}), __import__("mpi4py").MPI.COMM_SELF)
    assert x_on.tobytes() == x_off.tobytes()
    for a, b in zip(m_on, m_off):
        assert a.keys() == b.keys()
        assert all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)
    table = job(**{"run.eval_clients": False, "run.rounds": 1})
    (tmp_path / "job.toml").write_text(toml_document(table, "off"))
    assert cli.main(["run", str(tmp_path / "job.toml"), "--out", str(tmp_path / "off")]) == 0
    with h5py.File(tmp_path / "off" / "results.h5", "r") as f:
        assert "client_eval" not in f
    assert "Jain" not in report_text([tmp_path / "off"])
    with pytest.raises(HpcflError, match="run.eval_clients"):
        load(tmp_path / "off").to_pandas("client_eval")


def test_resume_keeps_the_rows_of_the_rounds_kept(tmp_path):
    path = tmp_path / "results.h5"
    attrs = {"config": {"run": {"name": "t"}}, "world_size": 1, "devices": ["cpu"]}
    row = {k: 0 for k in ("round", "client", "steps", "weight", "train_loss", "anorm", "anorm2", "alast",
                          "sim_time", "dropped")}
    w = ResultsWriter(path, attrs, np.ones((2, 3), dtype=np.int64), client_eval=True)
    for r in range(1, 5):
        w.append_round({**dict.fromkeys(w.metrics, 0.0), "round": r}, {**row, "round": [r], "client": [0]})
        w.append_client_eval(r, np.array([0.1 * r, 0.2 * r]), np.array([1.0, 2.0]), np.array([7, 9]))
    w.close()
    w = ResultsWriter(path, attrs, None, resume_at=2, client_eval=True)
    w.append_client_eval(3, np.array([0.5, 0.5]), np.array([3.0, 3.0]), np.array([7, 9]))
    w.close()
    ce = load(path).client_eval
    assert ce["round"].tolist() == [1, 1, 2, 2, 3, 3] and ce["accuracy"].tolist() == [0.1, 0.2, 0.2, 0.4, 0.5, 0.5]
    assert ce["samples"].tolist() == [7, 9] * 3
    # a run resumed with the evaluation on, from a file written without it, gets the group
    old = tmp_path / "old" / "results.h5"
    old.parent.mkdir()
    w = ResultsWriter(old, attrs, np.ones((2, 3), dtype=np.int64))
    w.close()
    w = ResultsWriter(old, attrs, None, resume_at=0, client_eval=True)
    w.append_client_eval(1, np.array([1.0, 0.0]), np.array([0.0, 9.0]), np.array([1, 1]))
    w.close()
    assert load(old).client_eval["accuracy"].tolist() == [1.0, 0.0]


def test_fairness_plot_draws_and_names_runs_without_it(two, tmp_path):
    assert cli.main(["plot", str(two), "--kind", "fairness", "--out", str(tmp_path / "f.svg"), "--size",
                     "600x400"]) == 0
    text = (tmp_path / "f.svg").read_text()
    assert "worst 10" in text and "Jain" in text and "held-out" in text
    assert cli.main(["plot", str(two), "--kind", "fairness", "--field", "loss", "--out",
                     str(tmp_path / "l.png")]) == 0
    assert cli.main(["plot", str(two), "--kind", "fairness", "--field", "steps", "--out",
                     str(tmp_path / "x.png")]) == 2


def test_a_damaged_client_eval_group_or_segment_is_refused(tmp_path):
    from hpcfl.io.h5check import BadFile

    attrs = {"config": {"run": {"name": "t"}}, "world_size": 1, "devices": ["cpu"]}
    w = ResultsWriter(tmp_path / "results.h5", attrs, np.ones((2, 3), dtype=np.int64), client_eval=True)
    w.append_client_eval(1, np.array([0.5, 1.0]), np.array([1.0, 0.5]), np.array([3, 4]))
    w.close()
    assert load(tmp_path).client_eval["samples"].tolist() == [3, 4]
    with h5py.File(tmp_path / "results.h5", "r+") as f:
        del f["client_eval/accuracy"]
        f["client_eval"].create_dataset("accuracy", data=np.ones((2, 2)))   # 2-D: not a column
    with pytest.raises(BadFile, match="accuracy"):
        load(tmp_path)
    with h5py.File(tmp_path / "results.h5", "r+") as f:
        del f["client_eval"]
        del f["segments/devices"]
        f["segments"].create_dataset("devices", data=np.array(["[not json"], dtype=h5py.string_dtype()))
    with pytest.raises(BadFile, match="devices"):
        load(tmp_path)


def test_every_client_at_once_as_one_client_alone():
    """The draw's vectorised quotas equal class_quota client by client; a large population draws
    without repeats within a client and with each client's own quota."""
    from hpcfl.data.client_test import quotas

    r = np.random.default_rng(3)
    for _ in range(300):
        c = int(r.integers(1, 6))
        cnt, av, m = r.integers(0, 5, (4, c)), r.integers(0, 6, c), r.integers(0, 12, 4)
        np.testing.assert_array_equal(quotas(cnt, m, av), [class_quota(cnt[i], int(m[i]), av) for i in range(4)])
    y = np.random.default_rng(0).integers(0, 10, 2000)
    counts = np.random.default_rng(1).multinomial(10, [0.1] * 10, size=20000)
    off, rows = client_test_sets(y, counts, 0, 10)
    assert off[-1] == rows.size == 20000 * 10
    for i in (0, 7, 19999):
        r_i = rows[off[i]:off[i + 1]]
        assert np.all(np.diff(r_i) > 0)
        np.testing.assert_array_equal(np.bincount(y[r_i], minlength=10),
                                      class_quota(counts[i], 10, np.bincount(y, minlength=10)))
