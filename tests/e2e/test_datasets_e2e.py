"""On-disk datasets through a whole run: files in the real formats -> loader -> LeNet-5 with
CIFAR augmentation -> results; and the same run on 2 ranks is bitwise equal."""

import sys
from pathlib import Path

import numpy as np
from clirun import assert_same_run, hpcfl

from hpcfl.results import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_data_files import write_cifar10, write_mnist  # noqa: E402  (the loader tests' writers)

JOB = """
[run]
name = "files"
seed = 0
rounds = 2
[data]
dataset = "{dataset}"
root = "{root}"
partition = "iid"
num_clients = 4
[model]
name = "lenet5"
[algorithm]
name = "fedavg"
lr = 0.01
batch_size = 4
local_epochs = 1
[runtime]
threads = 1
"""


def test_cifar10_batches_train_lenet5_with_augmentation_on_1_and_2_ranks(tmp_path):
    write_cifar10(str(tmp_path), n_per_batch=8, n_test=10)
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(dataset="cifar10", root=tmp_path) + "[data.cifar10]\naugment = true\n")
    for ranks, out in ((0, "one"), (2, "two")):
        p = hpcfl("run", str(job), "--out", str(tmp_path / out), ranks=ranks)
        assert p.returncode == 0, p.stderr
    r = load(tmp_path / "one")
    assert r.class_counts.sum() == 40 and r.final_params.size == 62006      # 5 batches x 8; LeNet-5
    assert np.isfinite(r.metrics["test_accuracy"][-1])
    assert_same_run(tmp_path / "one", tmp_path / "two")


def test_gzipped_mnist_idx_files_train(tmp_path):
    write_mnist(str(tmp_path), gz=True, n=16, m=6)
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(dataset="mnist", root=tmp_path))
    p = hpcfl("run", str(job), "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    r = load(tmp_path / "o")
    assert r.class_counts.sum() == 16 and r.final_params.size == 44426          # LeNet-5 on 1x28x28


def test_truncated_cifar_file_is_a_clear_input_error(tmp_path):
    d = write_cifar10(str(tmp_path))
    path = Path(d) / "data_batch_3"
    path.write_bytes(path.read_bytes()[:100])
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(dataset="cifar10", root=tmp_path))
    p = hpcfl("run", str(job), "--out", str(tmp_path / "o"), ranks=2)
    assert p.returncode == 2 and "data_batch_3" in p.stderr and "Traceback" not in p.stderr
