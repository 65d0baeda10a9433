"""Issue 37 (items 7, 9): the fault-injection test hook is parsed strictly, a folder at a temporary name of
results.h5 is refused at start, and every environment variable hpcfl reads is listed in docs/guide.md."""

import ast
import re
from pathlib import Path

import pytest

from hpcfl.engine.control import FAULT_KINDS, FAULT_PHASES, FaultInjector, fault_notice, parse_fault
from hpcfl.errors import HpcflError
from hpcfl.io import rundir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", ["1", "0:train:x:kill", "0:training:1:kill", "0:train:1:explode", "0:train:1",
                                  "0:train:1:kill:5", "-1:train:1:kill", " 0:train:1:kill", "0:train:-1:kill"])
def test_a_malformed_fault_spec_is_an_input_error_naming_the_format(spec):
    with pytest.raises(HpcflError) as e:
        parse_fault(spec)
    assert f"HPCFL_FAULT={spec!r} is not a fault" in str(e.value) and "RANK:PHASE:ROUND:KIND" in str(e.value)


def test_every_phase_and_kind_parses_and_the_notice_counts_rounds_from_1():
    assert parse_fault("") is None and fault_notice("") is None
    for phase in FAULT_PHASES:
        for kind in FAULT_KINDS:
            assert parse_fault(f"12:{phase}:0:{kind}") == (12, phase, 0, kind)
    assert "rank 2 will hang in phase 'eval' of round 8" in fault_notice("2:eval:7:hang")


def test_the_phases_are_the_ones_the_round_loop_enters_and_set_up():
    src = (ROOT / "hpcfl/engine/simulation.py").read_text()
    assert set(re.findall(r'control\.phase\("(\w+)"', src)) | {"setup"} == set(FAULT_PHASES)
    assert 'FaultInjector(comm.rank).check("setup", 0)' in (ROOT / "hpcfl/engine/setup.py").read_text()


def test_the_injector_targets_its_rank_only_and_refuses_a_bad_spec(monkeypatch):
    monkeypatch.setenv("HPCFL_FAULT", "1:reduce:3:raise")
    assert FaultInjector(0).target is None and FaultInjector(1).target == ("reduce", 3, "raise")
    FaultInjector(1).check("reduce", 2)   # another round: nothing
    with pytest.raises(RuntimeError, match="injected fault"):
        FaultInjector(1).check("reduce", 3)
    monkeypatch.setenv("HPCFL_FAULT", "1:reduce")
    with pytest.raises(HpcflError):
        FaultInjector(1)


@pytest.mark.parametrize("name", rundir.SCRATCH)
def test_a_folder_at_a_temporary_results_name_is_refused(tmp_path, name):
    rundir.check_scratch(tmp_path)   # nothing there: fine
    (tmp_path / name).write_text("stale")   # a stale file (or link) is the writer's to remove
    rundir.check_scratch(tmp_path)
    (tmp_path / name).unlink()
    (tmp_path / name).mkdir()
    with pytest.raises(HpcflError, match=re.escape(f"{tmp_path / name} is a folder")):
        rundir.check_scratch(tmp_path)


def test_the_scratch_names_are_the_results_writers():
    src = (ROOT / "hpcfl/io/results.py").read_text()
    for name in rundir.SCRATCH:   # built there as f".{self.path.name}.new-tmp"
        suffix = name.replace("results.h5", "")
        assert f'.{{self.path.name}}{suffix[1:]}' in src or f'self.path.name + "{suffix}"' in src, name


# ---- environment variables --------------------------------------------------------------------------------

_NAME = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$")


def variables_in_code() -> set[str]:
    """Names like FOO_BAR in the string constants of every hpcfl module that touches os.environ."""
    found = set()
    for path in (ROOT / "hpcfl").rglob("*.py"):
        src = path.read_text()
        if "environ" in src or "_ENV = " in src:   # a module may name a variable another one reads
            found |= {n.value for n in ast.walk(ast.parse(src))
                      if isinstance(n, ast.Constant) and isinstance(n.value, str) and _NAME.match(n.value)}
    return found - SYSCONF


SYSCONF = {"SC_CLK_TCK", "O_NOFOLLOW"}   # os.sysconf and os.open names, not variables


def variables_in_guide() -> set[str]:
    text = (ROOT / "docs/guide.md").read_text()
    section = text[text.index("### Environment variables"):]
    section = section[:section.index("\n## ")]
    cells = re.findall(r"^\| ([^|]*`[A-Z][^|]*) \|", section, re.MULTILINE)   # a row's first cell names one or more
    return {name for cell in cells for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", cell)}


@pytest.mark.source_scan
def test_every_environment_variable_hpcfl_reads_is_listed_in_the_guide():
    code, guide = variables_in_code(), variables_in_guide()
    assert "HPCFL_FAULT" in code and "SLURM_STEP_NUM_TASKS" in code   # the scan finds them
    assert code - guide == set(), "read by hpcfl but not in docs/guide.md's table"
    assert guide - code == set(), "in docs/guide.md's table but read nowhere"

