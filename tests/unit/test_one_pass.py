"""Every problem of a job at once (README: "every problem in it is reported at once"), the
dataset's missing files among them, and the nearest valid name for a misspelt one."""

import pytest
from test_data_files import write_cifar10

from hpcfl import config
from hpcfl.errors import ConfigError, nearest

CIFAR = """
[run]
roundz = 3
[data]
dataset = "cifar10"
root = "{root}"
num_clients = 4
[model]
name = "lenet5"
[algorithm]
name = "fedavgg"
"""


def problems(tmp_path, text, files=True):
    job = tmp_path / "job.toml"
    job.write_text(text)
    with pytest.raises(ConfigError) as exc:
        config.load(job, files=files)
    return exc.value.problems


def test_a_missing_data_folder_is_reported_with_the_config_errors(tmp_path):
    found = problems(tmp_path, CIFAR.format(root=tmp_path / "nowhere"))
    assert found == [
        "unknown key run.roundz; did you mean run.rounds?",
        "algorithm.name = 'fedavgg' is not valid; did you mean 'fedavg'? (or one of " + found[1].split("(or one of ")[1],
        f"data.root = '{tmp_path / 'nowhere'}' is not a directory (dataset 'cifar10' reads cifar-10-batches-py "
        f"from it); to download it: hpcfl data get cifar10 --root DIR, then data.root = DIR (hpcfl data list shows "
        f"the sources); to run without it on a CPU: --set data.dataset=synthetic_images",
    ]


def test_the_file_check_is_only_for_commands_that_read_the_data(tmp_path):
    assert len(problems(tmp_path, CIFAR.format(root=tmp_path / "nowhere"), files=False)) == 2
    (tmp_path / "here").mkdir()
    found = problems(tmp_path, CIFAR.format(root=tmp_path / "here"))   # the folder is there, empty
    assert len(found) == 3 and found[2].startswith(f"cifar10: no data_batch_1 found in any of {tmp_path / 'here'}")
    write_cifar10(str(tmp_path / "here"))
    assert len(problems(tmp_path, CIFAR.format(root=tmp_path / "here"))) == 2   # the batches are there


def test_an_npz_file_that_is_not_there(tmp_path):
    text = f"""
[data]
dataset = "npz"
root = "{tmp_path}"
[data.npz]
file = "absent.npz"
[model]
name = "logreg"
"""
    assert problems(tmp_path, text) == [f"data.npz.file: {tmp_path / 'absent.npz'} does not exist; set "
                                        f"data.npz.file (absolute, or relative to data.root)"]


def test_nearest_suggests_only_a_near_spelling():
    assert nearest("roundz", ["rounds", "seed", "name"]) == "rounds"
    assert nearest("lenet", ["lenet5", "mlp", "vgg11"]) == "lenet5"
    assert nearest("banana", ["rounds", "seed", "name"]) is None


def test_a_key_with_no_near_spelling_lists_the_valid_ones(tmp_path):
    found = problems(tmp_path, '[run]\nzzzzzz = 1\n[data]\ndataset = "digits"\n[model]\nname = "mlp"\n')
    assert found[0].startswith("unknown key run.zzzzzz; valid keys here: ") and "rounds" in found[0]
