"""Naturally partitioned data through the real CLI: LEAF's JSON and TFF's HDF5 in their exact layouts
-> loader -> ``partition = "natural"`` -> a few rounds -> results with per-client evaluation on each
client's own test rows; ``hpcfl partition`` shows the natural split; a malformed file exits 2 naming
the file, the user (client) and the field, without a traceback."""

import json
import sys
from pathlib import Path

import numpy as np
from clirun import hpcfl

from hpcfl.results import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from natural_writers import emnist_client, random_leaf, write_tff, write_tff_emnist  # noqa: E402

JOB = """
[run]
name = "natural"
seed = 1
rounds = 2
[data]
dataset = "{dataset}"
root = "{root}"
partition = "natural"
num_clients = {clients}
[model]
name = "{model}"
[algorithm]
name = "fedavg"
lr = 0.05
batch_size = 2
local_steps = 2
clients_per_round = 3
[runtime]
threads = 1
"""


def write_job(tmp_path, dataset, clients, model, extra=""):
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(dataset=dataset, root=tmp_path, clients=clients, model=model) + extra)
    return job


def test_leaf_femnist_like_run_evaluates_each_client_on_its_own_test_rows(tmp_path):
    random_leaf(tmp_path)   # 7 users: 4, 10, 8, 6, 5, 10, 8 training rows; 3, 1, 2, 3, 2, 0, 1 test rows
    job = write_job(tmp_path, "leaf", 7, "mlp", '[data.leaf]\nimage_shape = [1, 4, 4]\n[model.mlp]\nhidden = [8]\n')
    p = hpcfl("run", str(job), "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    assert "1 of 7 clients have none in the test file(s)" in p.stdout
    r = load(tmp_path / "o")
    assert r.class_counts.sum(axis=1).tolist() == [4, 10, 8, 6, 5, 10, 8]
    ce = r.client_eval
    assert ce["samples"].tolist() == [3, 1, 2, 3, 2, 0, 1] * 2 and ce["round"].tolist() == [1] * 7 + [2] * 7
    assert np.isnan(ce["accuracy"][5]) and np.isfinite(np.delete(ce["accuracy"], [5, 12])).all()
    p = hpcfl("partition", str(job), "--png", str(tmp_path / "split.png"))
    assert p.returncode == 0, p.stderr
    assert "7 clients, 4 classes, 51 samples assigned of 51 (0 unused)" in p.stdout
    assert (tmp_path / "split.png").stat().st_size > 1000


def test_tff_emnist_run_with_lenet5_on_each_writers_rows(tmp_path):
    write_tff_emnist(tmp_path)
    job = write_job(tmp_path, "tff", 3, "lenet5")
    p = hpcfl("run", str(job), "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    r = load(tmp_path / "o")
    assert r.class_counts.shape == (3, 62) and r.class_counts.sum(axis=1).tolist() == [2, 3, 4]
    assert r.final_params.size == 44_426 - 850 + 84 * 62 + 62   # LeNet-5 on 1x28x28, its last FC to 62 classes
    assert r.client_eval["samples"].tolist() == [1, 0, 2] * 2
    p = hpcfl("partition", str(job), "--png", str(tmp_path / "split.png"))
    assert p.returncode == 0 and "3 clients, 62 classes, 9 samples assigned" in p.stdout


def test_malformed_leaf_and_tff_files_exit_2_naming_file_user_and_field(tmp_path):
    random_leaf(tmp_path)
    bad = tmp_path / "train" / "b_train.json"
    doc = json.loads(bad.read_text())
    user = doc["users"][1]
    doc["user_data"][user]["x"][2][3] = "oops"
    bad.write_text(json.dumps(doc))
    job = write_job(tmp_path, "leaf", 7, "mlp")
    p = hpcfl("run", str(job), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"b_train.json: user_data['{user}']['x'][2][3] is 'oops' (a str); expected a number" in p.stderr

    tff = tmp_path / "tff"
    tff.mkdir()
    good = emnist_client(1, 2, [0, 1])
    write_tff(tff / "fed_emnist_train.h5", {"w0": good, "w1": {"pixels": good["pixels"], "label": good["label"][:1]}})
    write_tff(tff / "fed_emnist_test.h5", {"w0": good})
    job = write_job(tff, "tff", 2, "lenet5").read_text().replace("clients_per_round = 3", "clients_per_round = 2")
    (tff / "job.toml").write_text(job)
    job = tff / "job.toml"
    p = hpcfl("run", str(job), "--out", str(tmp_path / "o2"), ranks=2)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "fed_emnist_train.h5: client 'w1' has 2 rows of 'pixels' but 1 of 'label'" in p.stderr

    job = write_job(tmp_path, "leaf", 5, "mlp")
    bad.unlink()
    random_leaf(tmp_path)
    p = hpcfl("run", str(job), "--out", str(tmp_path / "o3"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "data.num_clients = 5, but 'leaf' has 7 natural clients; set data.num_clients = 7" in p.stderr
