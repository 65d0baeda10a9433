"""``hpcfl plan``: the estimator's terms by hand on a tiny job, the run's own errors, and the
warnings (against real runs: tests/e2e/test_plan_measured.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from runner import PLAN_TINY as TINY

from hpcfl import cli, config
from hpcfl.engine import plan

ROOT = Path(__file__).resolve().parents[2]


def tiny(**sets):
    return config.load(TINY, [f"{k}={v}" for k, v in sets.items()])


def test_terms_of_a_tiny_job_by_hand():
    p = plan.estimate(tiny(), ranks=2, base=0)
    assert (p.params, p.clients, p.clients_per_rank, p.ranks_per_node) == (15, 7, 4, 2)
    t = p.terms
    assert t["  partition index"] == 70 * 8                # 8 B per training sample
    assert t["  sizes, owner, offsets"] == 3 * 8 * 7 + 8
    assert t["  slot"] == 7 * 8
    assert t["  class counts"] == 7 * 3 * 8                # N x C x 8 B
    assert t["  sampler"] == 7 * 8                         # static weights, float64
    # held-out rows: sizes (N), pairs (row, client) of 8 B each, 2N float64 sums; 10 rows a client here
    assert t["  evaluation pairs and sizes"] == 7 * 8 + 70 * 16
    assert t["  evaluation sums"] == 2 * 7 * 8
    assert t["tables over N clients"] == 560 + 232 + 168 + 56 + 1288
    assert t["  of which shared per node"] == 0            # every array under hpcfl.parallel.shared.MIN_BYTES
    assert t["per-client state (own)"] == 4 * 15 * 4       # SCAFFOLD's c_i: 4 own clients x P x float32
    assert t["dataset"] == 70 * 4 * 4 + 70 * 8 + 60 * 4 * 4 + 60 * 8
    assert t["model copies"] == plan.MODEL_COPIES * 15 * 4 + 15 * 4   # + the server's c
    # checkpoint: the model, SCAFFOLD's c and all 7 clients' c_i rows
    assert p.checkpoint_bytes == plan.CHECKPOINT_FIXED_BYTES + 15 * 4 + 15 * 4 + 7 * 15 * 4
    assert p.rank_bytes == sum(v for k, v in t.items() if not k.startswith(" "))


def test_results_bytes_closed_form():
    per_round, total = plan.results_bytes(200, 60, 40, cohort=3, clients=7, rounds=4, eval_rounds=2,
                                          counts_bytes=168, chunk=1024, model_bytes=60)
    assert per_round == 200 + 3 * 60 + 7 * 40 * 2 // 4
    assert total == plan.RESULTS_HEADER_BYTES + 168 + 60 + 1024 * (200 + 60 + 40)   # one chunk each


def test_node_memory_counts_a_cached_dataset_once():
    p = plan.estimate(tiny(**{"data.cache": "auto"}), ranks=4, nodes=2, base=0)
    assert p.dataset_cached and p.ranks_per_node == 2
    d = p.terms["dataset"]
    assert p.node_bytes == 2 * (p.rank_bytes - d) + d
    assert p.node_bytes_miss == p.node_bytes + d
    assert plan.estimate(tiny(**{"data.cache": "auto"}), ranks=4, nodes=2, base=0).cache_hit   # made by the first
    q = plan.estimate(tiny(**{"data.cache": "off"}), ranks=4, nodes=2, base=0)
    assert not q.dataset_cached and q.node_bytes == 2 * q.rank_bytes


def test_node_memory_counts_the_shared_tables_once(monkeypatch):
    """With a node of 2 ranks, the read-only tables (each array of at least MIN_BYTES) are one copy per
    node (hpcfl.engine.setup.share_tables); a rank's resident memory still counts the pages it reads."""
    monkeypatch.setattr(plan, "MIN_BYTES", 0)
    p = plan.estimate(tiny(**{"data.cache": "off"}), ranks=4, nodes=2, base=0)
    shared = 560 + (3 * 56 + 8) + 168 + (56 + 1120)        # index, sizes/owner/offsets, counts, eval pairs
    assert p.terms["  of which shared per node"] == shared
    # the dataset the cache does not serve: its arrays (all of them, at MIN_BYTES 0) in the node's windows,
    # and, while the first rank fills them, its own copy as well (hpcfl.engine.dataload)
    d = p.terms["dataset"]
    assert d == 70 * 4 * 4 + 70 * 8 + 60 * 4 * 4 + 60 * 8
    assert p.node_bytes == 2 * (p.rank_bytes - d - shared) + d + shared and p.node_bytes_miss == p.node_bytes + d
    alone = plan.estimate(tiny(**{"data.cache": "off"}), ranks=2, nodes=2, base=0)   # one rank a node
    assert alone.terms["  of which shared per node"] == 0 and alone.node_bytes == alone.rank_bytes


def test_more_ranks_than_clients_is_the_runs_message(capsys, tmp_path):
    job = tmp_path / "tiny.toml"
    job.write_text(TINY)
    assert cli.main(["plan", str(job), "--ranks", "8"]) == 2
    err = capsys.readouterr().err
    assert "8 MPI ranks but only data.num_clients = 7 clients" in err and "start at most 7 ranks" in err
    assert cli.main(["plan", str(job), "--ranks", "2", "--nodes", "3"]) == 2
    assert "no more nodes than ranks" in capsys.readouterr().err
    assert cli.main(["plan", str(job), "--set", "algorithm.lrr=1"]) == 2
    assert "algorithm.lrr" in capsys.readouterr().err


def test_cli_prints_a_table_and_json(capsys, tmp_path):
    job = tmp_path / "tiny.toml"
    job.write_text(TINY)
    assert cli.main(["plan", str(job), "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "total per rank" in out and "checkpoint:" in out and "warnings: none" in out
    assert cli.main(["plan", str(job), "--ranks", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["clients_per_rank"] == 4 and got["params"] == 15


def _plan(**kw) -> plan.Plan:
    p = plan.Plan(ranks=4, nodes=1, ranks_per_node=4, clients=100, clients_per_rank=25, params=10, dataset_cached=True)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


CFG = SimpleNamespace(watchdog=SimpleNamespace(startup_s=600.0))


def test_warnings_name_the_problem_and_the_fix():
    assert plan.warnings(_plan(save_s=100.0, node_bytes=10, node_bytes_miss=10), CFG, 100, 300.0) == []
    slow = plan.warnings(_plan(save_s=400.0), CFG, 0, 300.0)
    assert len(slow) == 2
    assert "longer than the signal margin of 300 s" in slow[0] and "--signal=B:USR1@600" in slow[0]
    assert "watchdog's first-checkpoint allowance of 600 s" in slow[1] and "watchdog.startup_s=1200" in slow[1]
    near = plan.warnings(_plan(save_s=301.0), CFG, 0, 1000.0)   # only over half the allowance
    assert len(near) == 1 and "checkpoint.every_minutes" in near[0]
    full = plan.warnings(_plan(node_bytes=5 * 10**9, node_bytes_miss=6 * 10**9), CFG, 4 * 10**9, 300.0)
    assert len(full) == 1 and "needs ~6.0 GB but has 4.0 GB" in full[0] and "--nodes" in full[0]


def test_measured_disk_rate(tmp_path):
    rate = plan.measure_disk(tmp_path, 16 << 20)
    assert rate > 0 and list(tmp_path.iterdir()) == []   # the file is removed
    assert plan.measure_disk(tmp_path / "new", 8 << 20) > 0 and not (tmp_path / "new").exists()   # and a folder it made


def test_recorded_rows_follow_results_clients():
    """/clients rows an average round writes, by results.clients."""
    assert plan.recorded_rows(tiny(), 3, 7) == 3
    assert plan.recorded_rows(tiny(**{"results.clients": "none"}), 3, 7) == 0
    # sampled 0.3 of 7 clients: a panel of ceil(2.1) = 3; a cohort of 3 meets 3 * 3/7 of it on average
    assert plan.recorded_rows(tiny(**{"results.clients": "sampled", "results.client_sample": 0.3}), 3, 7) == 9 / 7
    p_all = plan.estimate(tiny(), ranks=1, base=0)
    p_none = plan.estimate(tiny(**{"results.clients": "none"}), ranks=1, base=0)
    # TINY's cohort is 3 clients: 3 rows of round, client, steps, weight, train_loss, ... (73 bytes) a round
    assert p_all.results_round_bytes - p_none.results_round_bytes == 3 * 73


def test_a_sharded_checkpoint_is_timed_by_the_largest_ranks_rows():
    one, two = plan.estimate(tiny(), ranks=1, base=0), plan.estimate(tiny(), ranks=2, base=0)
    off = plan.estimate(tiny(**{"checkpoint.shards": "false"}), ranks=2, base=0)
    rows, own = 7 * 15 * 4, 4 * 15 * 4       # SCAFFOLD's c_i of 15 float32: all 7 clients', rank 0's 4
    assert one.checkpoint_bytes == two.checkpoint_bytes == off.checkpoint_bytes
    assert one.save_s == off.save_s == one.checkpoint_bytes / 1e9 * plan.SAVE_S_PER_GB
    assert two.save_s == (two.checkpoint_bytes - rows + own) / 1e9 * plan.SAVE_S_PER_GB
    assert (one.save_share, two.save_share) == (one.checkpoint_bytes, two.checkpoint_bytes - rows + own)
