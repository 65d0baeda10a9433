"""Issue 37.8: ``hpcfl sweep --list`` of a 100 x 100 x 100 grid ran 12 minutes at 1.1 GB, deaf to SIGTERM,
and said it would stop "at the end of start-up or of the round". Grids are bounded (MAX_POINTS, raised
by --max-points), points are built one at a time, the listing streams, and a stop signal during
planning or listing ends the command within a point's time with a message that says what happened."""

import itertools
import signal
import time
import tracemalloc

import pytest

from clirun import hpcfl, kill_group, start
from hpcfl import signals
from hpcfl.cli import sweep
from hpcfl.errors import ConfigError

QUICK = """
[run]
name = "big"
rounds = 2
[data]
dataset = "digits"
num_clients = 10
[model]
name = "mlp"
[algorithm]
name = "fedavg"
clients_per_round = 2
lr = 0.05
batch_size = 16
local_steps = 2
[sweep]
"""


def grid_job(tmp_path, sizes=(100, 100, 100)):
    keys = ("run.seed", "algorithm.momentum", "algorithm.lr")
    makers = (lambda i: i, lambda i: round(0.001 * i, 3), lambda i: round(0.01 + 0.001 * i, 3))
    grid = {k: [make(i) for i in range(n)] for k, make, n in zip(keys, makers, sizes)}
    (tmp_path / "big.toml").write_text(QUICK + "".join(f'"{k}" = {v}\n' for k, v in grid.items()))
    return tmp_path / "big.toml", grid


def test_a_grid_over_the_limit_is_refused_at_once_naming_its_size_and_the_flag(tmp_path):
    job, _ = grid_job(tmp_path)
    t = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        sweep.expand(job)
    assert time.perf_counter() - t < 5
    msg = str(e.value)
    assert "[sweep] has 1,000,000 points (run.seed (100) x algorithm.momentum (100) x algorithm.lr (100))" in msg
    assert f"more than the limit of {sweep.MAX_POINTS:,}" in msg and "--max-points 1000000" in msg


def test_points_are_built_one_at_a_time_in_grid_order(tmp_path):
    """A 30,000-point grid under a raised limit: expanding it without the check holds its names only
    (about 200 bytes a point, where each point's job took about 1 kB), and any point (first, last, in
    between) is the one the cartesian product puts there."""
    job, grid = grid_job(tmp_path, (100, 100, 3))
    tracemalloc.start()
    s = sweep.expand(job, max_points=30_000, check=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(s.points) == 30_000 and peak < 12e6, peak
    combos = itertools.product(*grid.values())
    for i in (0, 1, 2, 3, 299, 300, 12_345, 29_999):
        combo = next(itertools.islice(itertools.product(*grid.values()), i, None))
        p = s.points[i]
        assert p.index == i and p.sets == tuple(sweep.set_text(k, v) for k, v in zip(grid, combo))
        assert p.table["run"]["seed"] == combo[0] and p.table["algorithm"]["lr"] == combo[2]
        assert p.table["run"]["name"] == p.name
    assert s.points[-1].index == 29_999 and next(combos) == tuple(v[0] for v in grid.values())


def test_the_listing_streams_and_a_stop_request_ends_planning(tmp_path):
    job, _ = grid_job(tmp_path, (100, 100))
    s = sweep.expand(job, check=False)
    t = time.perf_counter()
    first = list(itertools.islice(sweep.listing(s, []), 4))   # header, column titles, points 0 and 1
    assert time.perf_counter() - t < 5 and first[2].split()[:2] == ["0", s.points.names[0]]
    signals._requested.append("SIGTERM")
    try:
        with pytest.raises(sweep.Interrupted, match=r"SIGTERM received while checking the grid's points \(at "
                                                    r"point 0 of 10,000\); stopped before running anything"):
            sweep.expand(job)
        with pytest.raises(sweep.Interrupted, match="while listing the grid's points"):
            list(sweep.listing(s, []))
    finally:
        signals._requested.clear()


@pytest.mark.parametrize("listing", [True, False])
def test_sigterm_during_listing_or_planning_ends_the_sweep_promptly(tmp_path, listing):
    job, _ = grid_job(tmp_path, (100, 100, 3))   # 30,000 points: a minute or more to check
    out = tmp_path / "out"
    p = start("sweep", str(job), "--out", str(out), "--max-points", "30000", *(["--list"] if listing else []))
    try:
        time.sleep(8 if listing else 6)   # start-up, then well into the points
        assert p.poll() is None, p.communicate()
        sent = time.monotonic()
        kill_group(p, signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        kill_group(p)
    assert p.returncode == 75 and took < 10, (p.returncode, took, stderr)
    assert "SIGTERM received: the sweep's planning stops now (nothing has run yet)" in stderr, stderr
    assert "stopped before running anything, nothing was written" in stderr and "Traceback" not in stderr
    assert "end of start-up" not in stderr and not out.exists()
    if listing:
        assert stdout.splitlines()[2].startswith("    0  "), stdout[:500]   # points were printed as they came


def test_max_points_lets_a_larger_grid_through(tmp_path):
    job, _ = grid_job(tmp_path, (3, 2, 2))
    p = hpcfl("sweep", str(job), "--list", "--max-points", "11")
    assert p.returncode == 2 and "[sweep] has 12 points" in p.stderr and "--max-points 12" in p.stderr, p.stderr
    p = hpcfl("sweep", str(job), "--list", "--max-points", "12")
    assert p.returncode == 0 and "12 point(s)" in p.stdout and "sbatch --array=0-11" in p.stdout, p.stderr
