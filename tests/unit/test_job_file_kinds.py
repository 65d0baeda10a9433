"""A job file is a regular file: a FIFO, a device or a folder is refused at once, saying what it
is (it was "not found" before, and a FIFO named as the job must never block the read)."""

import os
import time

import pytest

from hpcfl.config.read import read_job
from hpcfl.errors import ConfigError


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "job.toml"
    os.mkfifo(fifo)
    t = time.monotonic()
    with pytest.raises(ConfigError, match=r"cannot be read: not a regular file but a FIFO \(named pipe\)"):
        read_job(fifo)
    assert time.monotonic() - t < 2.0


@pytest.mark.parametrize("path,kind", [("/dev/zero", "a character device"), ("/tmp", "a folder")])
def test_a_device_or_a_folder_is_refused_naming_what_it_is(path, kind):
    with pytest.raises(ConfigError, match=f"job file '{path}' cannot be read: not a regular file but {kind}"):
        read_job(path)


def test_a_missing_file_is_still_not_found(tmp_path):
    with pytest.raises(ConfigError, match="not found; pass the path of a TOML job file"):
        read_job(tmp_path / "nope.toml")


def test_a_regular_file_is_read(tmp_path):
    (tmp_path / "job.toml").write_text('[run]\nname = "x"\n')
    assert read_job(tmp_path / "job.toml") == {"run": {"name": "x"}}
