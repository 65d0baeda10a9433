"""tools/mutation.py, the mutation-testing driver (docs/testing.md): its scopes name real files, the
config it writes is the one setup.cfg keeps, and its table counts mutmut's outcomes as documented."""

import configparser
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import mutation  # noqa: E402


def test_every_scope_names_modules_and_test_files_that_exist():
    assert mutation.check_scopes() == []
    # and a broken one is reported by name
    mutation.SCOPES["broken"] = (["hpcfl/nowhere/*.py"], ["tests/unit/test_nowhere.py"])
    try:
        assert mutation.check_scopes() == ["scope broken: hpcfl/nowhere/*.py matches no file",
                                           "scope broken: test file tests/unit/test_nowhere.py is missing"]
    finally:
        del mutation.SCOPES["broken"]


def _mutmut_view(text: str) -> dict:
    """The [mutmut] section as mutmut 3.8 reads lists from setup.cfg: one item per non-empty line."""
    cp = configparser.ConfigParser()
    cp.read_string(text)
    return {k: [x for x in v.split("\n") if x] for k, v in cp["mutmut"].items()}


def test_setup_cfg_holds_the_parallel_scope_as_the_driver_writes_it():
    ours = _mutmut_view((ROOT / "setup.cfg").read_text())
    assert ours == _mutmut_view(mutation.mutmut_section(*mutation.SCOPES["parallel"]))
    assert ours["source_paths"] == ["hpcfl/"]
    # one argv item per line; "not timing" is one item (a marker expression with a space)
    assert ours["pytest_add_cli_args"] == ["-p", "no:cacheprovider", "-m", "not timing and not source_scan"]
    assert ours["also_copy"] == mutation.ALSO_COPY and "jobs/" in ours["also_copy"]   # tests read shipped jobs
    # no deprecated 3.x names (paths_to_mutate, tests_dir), no MPI tests
    assert not {"paths_to_mutate", "tests_dir"} & set(ours)
    assert all(t.startswith("tests/unit/") for t in ours["pytest_add_cli_args_test_selection"])


def test_write_config_replaces_only_the_mutmut_section(tmp_path):
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n\n[mutmut]\nsource_paths = old/\n\n[tool:pytest]\ntimeout = 9\n")
    mutation.write_config(tmp_path, ["hpcfl/a.py"], ["tests/unit/test_a.py"])
    cp = configparser.ConfigParser()
    cp.read(tmp_path / "setup.cfg")
    assert cp["metadata"]["name"] == "x" and cp["tool:pytest"]["timeout"] == "9"
    assert cp["mutmut"]["only_mutate"].split() == ["hpcfl/a.py"]
    assert cp["mutmut"]["pytest_add_cli_args_test_selection"].split() == ["tests/unit/test_a.py"]


def test_tally_counts_mutmuts_exit_codes_and_the_score(tmp_path):
    meta = tmp_path / "mutants" / "hpcfl" / "m.py.meta"
    meta.parent.mkdir(parents=True)
    # 1 and 3 killed, 0 survived, 36 timeout, 33 no tests (other); natural order of the survivors
    codes = {"hpcfl.m.x_f__mutmut_1": 1, "hpcfl.m.x_f__mutmut_2": 3, "hpcfl.m.x_f__mutmut_10": 0,
             "hpcfl.m.x_f__mutmut_9": 0, "hpcfl.m.x_f__mutmut_4": 36, "hpcfl.m.x_g__mutmut_1": 33}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    rows = mutation.tally(tmp_path)
    r = rows["hpcfl/m.py"]
    assert (r["mutants"], r["killed"], r["survived"], r["timeout"], r["other"]) == (6, 2, 2, 1, 1)
    assert r["survivors"] == ["hpcfl.m.x_f__mutmut_9", "hpcfl.m.x_f__mutmut_10", "hpcfl.m.x_g__mutmut_1 (exit 33)"]
    # score = (killed + timeout) / mutants = 3/6
    assert mutation.table(rows).splitlines()[-1] == "| hpcfl/m.py | 6 | 2 | 2 | 1 | 1 | 50.0% |"


def test_report_prints_a_kept_copys_table_and_refuses_a_run_that_ran_nothing(tmp_path, capsys):
    meta = tmp_path / "mutants" / "hpcfl" / "m.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {"hpcfl.m.x_f__mutmut_1": 1, "hpcfl.m.x_f__mutmut_2": 0}}))
    assert mutation.main(["--report", str(tmp_path), "--no-diffs"]) == 0
    out = capsys.readouterr().out
    assert "| hpcfl/m.py | 2 | 1 | 1 | 0 | 0 | 50.0% |" in out and "-- survived: hpcfl.m.x_f__mutmut_2" in out
    # every mutant "other": the unmutated run failed, and zeros are no score
    meta.write_text(json.dumps({"exit_code_by_key": {"hpcfl.m.x_f__mutmut_1": 33, "hpcfl.m.x_f__mutmut_2": None}}))
    with pytest.raises(SystemExit, match="no mutant was run; the tests fail on the unmutated code"):
        mutation.main(["--report", str(tmp_path), "--no-diffs"])
    with pytest.raises(SystemExit):
        mutation.main(["--report", str(tmp_path / "nothing")])
    assert "not a kept copy (no mutants/ folder in it)" in capsys.readouterr().err
