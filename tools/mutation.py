"""Mutation testing of hpcfl, one scope at a time, with mutmut (docs/testing.md, "Mutation testing").

mutmut changes the code one small edit at a time (``<`` to ``<=``, ``+ 1`` to ``+ 2``, a constant, a
dropped argument) and runs the tests on each such *mutant*; a mutant no test fails on *survived*, and
points at behaviour the tests do not pin down. This script runs it on a named scope of modules with
only the unit test files that cover them (a mutant of the exact sum has nothing to learn from the
plot tests, and the whole suite per mutant would take days), in a scratch copy of the repository:
mutmut writes a ``mutants/`` tree and its own pytest runs beside the sources, and none of that
belongs in a working tree. MPI tests stay out (they need ``mpiexec``); the unit tests of a scope
are the ones that exercise its single-process paths.

Usage::

    python tools/mutation.py parallel            # one scope (make mutation; SCOPE=all for all)
    python tools/mutation.py parallel --keep     # keep the scratch copy, to `mutmut show` there
    python tools/mutation.py --list              # the scopes, their modules and test files

Prints, per module, the mutants, killed, survived, timeouts and the score (killed + timeout over
all, mutmut's own count: a timeout is a mutant the tests noticed, as an endless loop), then each
survivor's diff. Exit status 0 whatever the score: the numbers are for reading, not a gate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# scope -> (modules to mutate, as globs relative to the repository root; unit test files that cover
# them, found by grepping tests/unit for the modules' imports). Keep each test list to the files that
# import the scope's modules: every test in it runs on every mutant it covers.
SCOPES = {
    # the exact sums and the communicator. gridsum_kernels.py stays out: its loops are numba
    # njit functions, compiled from their source, which mutmut's trampolines cannot pass through;
    # gridsum.py's numpy deposit is their bitwise reference and is mutated instead.
    "parallel": (["hpcfl/parallel/gridsum.py", "hpcfl/parallel/gridsum_torch.py", "hpcfl/parallel/comm.py"],
                 ["tests/unit/test_gridsum.py", "tests/unit/test_gridsum_edges.py", "tests/unit/test_gridsum_torch.py",
                  "tests/unit/test_gridsum_torch_paths.py",
                  "tests/unit/test_device_sums.py", "tests/unit/test_comm.py",
                  "tests/unit/test_collectives.py", "tests/unit/test_policy_traffic.py"]),
    # the list: checkpoints (and the durable writes under them), results, the reader, held
    # folders, the resume check. h5check.py (hostile-file checks), schema, summaries and rundir's
    # naming are outside it
    "io": (["hpcfl/io/checkpoint.py", "hpcfl/io/ckptblocks.py", "hpcfl/io/ckptfile.py",
            "hpcfl/io/safefs.py", "hpcfl/io/heldir.py", "hpcfl/io/results.py",
            "hpcfl/io/results_final.py", "hpcfl/io/results_h5.py", "hpcfl/io/reader.py",
            "hpcfl/io/resume_check.py"],
           ["tests/unit/test_checkpoint.py", "tests/unit/test_checkpoint_durability.py",
            "tests/unit/test_checkpoint_held.py", "tests/unit/test_ckpt_stream.py",
            "tests/unit/test_checkpoint_store_edges.py", "tests/unit/test_checkpoint_inputs.py",
            "tests/unit/test_results_file.py", "tests/unit/test_results_hostile.py",
            "tests/unit/test_rundir.py", "tests/unit/test_resume_check.py",
            "tests/unit/test_results_writer_edges.py", "tests/unit/test_results_last_writes.py",
            "tests/unit/test_results_reader.py", "tests/unit/test_results_reader_damaged.py",
            "tests/unit/test_export.py",
            "tests/unit/test_heldir_mutants.py", "tests/unit/test_safefs_mutants.py"]),
    # the list: resume, run control, the watchdog, placement (the round loop itself is
    # covered bitwise by the MPI suite, which mutmut cannot run)
    "engine": (["hpcfl/engine/resume.py", "hpcfl/engine/control.py", "hpcfl/engine/watchdog.py",
                "hpcfl/engine/placement.py"],
               ["tests/unit/test_run_control.py", "tests/unit/test_watchdog.py",
                "tests/unit/test_checkpoint_durability.py", "tests/unit/test_ckpt_stream.py",
                "tests/unit/test_rundir.py", "tests/unit/test_determinism.py",
                "tests/unit/test_straggler.py", "tests/unit/test_sampling.py",
                "tests/unit/test_placement.py", "tests/unit/test_resume_rows.py",
                "tests/unit/test_resume_settle.py",
                "tests/unit/test_control_mutants.py", "tests/unit/test_watchdog_mutants.py"]),
    "data": (["hpcfl/data/partition*.py", "hpcfl/data/client_test.py", "hpcfl/data/fetch.py"],
             ["tests/unit/test_data_partition.py", "tests/unit/test_data_partition_labels.py",
              "tests/unit/test_client_eval_natural.py", "tests/unit/test_data_get.py",
              "tests/unit/test_data_get_hostile.py",
              "tests/unit/test_fetch_mutants.py", "tests/unit/test_fetch_mutants_get.py",
              "tests/unit/test_client_test_mutants.py",
              "tests/unit/test_partition_mutants.py", "tests/unit/test_partition_labels_mutants.py"]),
    # FedNova is server.py's NovaRule (+ nova_diag.py), SCAFFOLD variates.py, GIFT's controller gift.py
    "algorithms": (["hpcfl/algorithms/protocol.py", "hpcfl/algorithms/server.py",
                    "hpcfl/algorithms/nova_diag.py", "hpcfl/algorithms/variates.py",
                    "hpcfl/algorithms/gift.py", "hpcfl/algorithms/fedlga*.py"],
                   ["tests/unit/test_protocol.py", "tests/unit/test_algorithms.py",
                    "tests/unit/test_fednova.py", "tests/unit/test_nova_diag.py", "tests/unit/test_scaffold.py",
                    "tests/unit/test_variates.py", "tests/unit/test_policy_check.py",
                    "tests/unit/test_protocol_mutants.py", "tests/unit/test_server_mutants.py",
                    "tests/unit/test_nova_diag_mutants.py", "tests/unit/test_variates_mutants.py",
                    "tests/unit/test_tau_control.py", "tests/unit/test_gift_engine.py",
                    "tests/unit/test_fedlga.py", "tests/unit/test_fedlga_grad.py",
                    "tests/unit/test_gift_mutants.py", "tests/unit/test_fedlga_grad_mutants.py",
                    "tests/unit/test_fedlga_mutants.py"]),
}

# what survives the scratch copy: the tracked and untracked-but-not-ignored files
SKIP_DIRS = {".git", "mutants", "runs", ".venv", "__pycache__", ".pytest_cache", "build", "dist"}

# mutmut's exit codes (mutmut.stats.status_by_exit_code), grouped as the table counts them
KILLED, SURVIVED, TIMEOUT = {1, 3}, {0}, {36, 24, -24, 152, 255}


def check_scopes(root: Path = ROOT) -> list[str]:
    """The problems of :data:`SCOPES` against the tree at ``root``: a glob that matches no module, a
    test file that is not there. Empty when every scope is runnable (tests/unit/test_mutation_tool.py)."""
    problems = []
    for name, (globs, tests) in SCOPES.items():
        for g in globs:
            if not list(root.glob(g)):
                problems.append(f"scope {name}: {g} matches no file")
        for t in tests:
            if not (root / t).is_file():
                problems.append(f"scope {name}: test file {t} is missing")
    return problems


def copy_tree(dest: Path) -> None:
    """The repository's files as git sees them (tracked and untracked, not ignored) into ``dest``."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                             check=True, capture_output=True).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):   # not a git checkout: everything but SKIP_DIRS
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts)]
    for f in files:
        src = ROOT / f
        if src.is_file() and not SKIP_DIRS & set(Path(f).parts):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


# folders beside hpcfl/ that tests read (mutmut copies tests/, setup.cfg and the sources itself)
ALSO_COPY = ["jobs/", "slurm/", "bench/", "tools/", "docs/", "README.md", "Makefile"]


DESELECT = "not timing and not source_scan"


def mutmut_section(globs: list[str], tests: list[str]) -> str:
    """setup.cfg's ``[mutmut]`` for one scope: the whole package is copied (imports between modules),
    only the scope's modules are mutated, only its test files run. The keys are mutmut 3.8's."""
    lines = ["[mutmut]", "source_paths = hpcfl/", "only_mutate ="]
    lines += [f"    {g}" for g in globs]
    lines += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in tests]
    # -x is mutmut's own; no cache folder written in the copy by the hundreds of runs
    # and no timing test (a ratio of measured times says nothing about a mutant and flakes under the
    # load of hundreds of runs) nor a scan of the source text (mutmut's copy holds every mutant's
    # strings): setup.cfg's `timing` and `source_scan` markers
    lines += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -m", f"    {DESELECT}"]
    # the copy is no git checkout: no change detection from git history
    lines += ["use_git_change_detection = false"]
    # mutmut runs the tests inside mutants/, which holds only source_paths and also_copy: tests that
    # read a shipped job file or the shell wrapper need them there too
    lines += ["also_copy ="] + [f"    {d}" for d in ALSO_COPY]
    return "\n".join(lines) + "\n"


def write_config(work: Path, globs: list[str], tests: list[str]) -> None:
    """Replace the copy's ``[mutmut]`` section of setup.cfg with the scope's."""
    cfg = work / "setup.cfg"
    kept, skipping = [], False
    for line in cfg.read_text().splitlines():
        if line.startswith("["):
            skipping = line.strip() == "[mutmut]"
        if not skipping:
            kept.append(line)
    cfg.write_text("\n".join(kept).rstrip("\n") + "\n\n" + mutmut_section(globs, tests))


def mutmut_exe() -> Path:
    """mutmut beside this Python (the same environment, hence the same torch and numba)."""
    exe = Path(sys.executable).with_name("mutmut")
    if not exe.is_file():
        sys.exit(f"tools/mutation.py: no mutmut beside {sys.executable}: "
                 "pip install -e '.[mutation]' (mutmut>=3.8) in this environment")
    return exe


def _default_sigint() -> None:
    # Started in the background (nohup ... &), a process inherits Ctrl-C ignored, and the data
    # scope's test of what Ctrl-C leaves behind then fails on the unmutated code
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def mutmut(work: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # import the mutants, not ROOT
    subprocess.run([str(mutmut_exe()), *args], cwd=work, env=env, check=False, preexec_fn=_default_sigint)


# `mutmut show NAME` loads mutmut afresh for each survivor (about 1 s each): one process does them all
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
print(json.dumps({name: get_diff_for_mutant(name, path=path) for name, path in json.load(sys.stdin)}))
"""


def survivor_diffs(work: Path, rows: dict[str, dict]) -> dict[str, str]:
    """The unified diff of each survivor of :func:`tally`'s rows, by name (mutmut's own diff)."""
    items = [(s.split(" ")[0], module) for module, r in rows.items() for s in r["survivors"]]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", _DIFFS], cwd=work, env=env, input=json.dumps(items),
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {name: f"(no diff: {out.stderr.strip().splitlines()[-1:]})" for name, _ in items}
    return json.loads(out.stdout.strip().splitlines()[-1])


def tally(work: Path) -> dict[str, dict]:
    """Per mutated module: counts by outcome and the survivors' names, from mutmut's .meta files."""
    rows = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        module = str(meta.relative_to(work / "mutants"))[:-len(".meta")]
        row = {"mutants": len(codes), "killed": 0, "survived": 0, "timeout": 0, "other": 0, "survivors": []}
        for name, code in sorted(codes.items(), key=lambda kv: _natural(kv[0])):
            if code in KILLED:
                row["killed"] += 1
            elif code in SURVIVED:
                row["survived"] += 1
                row["survivors"].append(name)
            elif code in TIMEOUT:
                row["timeout"] += 1
            else:   # not checked, no tests, suspicious, segfault: counted apart, never as killed
                row["other"] += 1
                row["survivors"].append(f"{name} (exit {code})")
        rows[module] = row
    return rows


def _natural(name: str):
    head, _, num = name.rpartition("_")
    return (head, int(num)) if num.isdigit() else (name, 0)


def table(rows: dict[str, dict]) -> str:
    """A Markdown table of :func:`tally`'s rows with a total line; score = (killed + timeout) / mutants."""
    out = ["| module | mutants | killed | survived | timeout | other | score |", "|---|---:|---:|---:|---:|---:|---:|"]
    total = {k: 0 for k in ("mutants", "killed", "survived", "timeout", "other")}
    for module, r in rows.items():
        out.append(_line(module, r))
        for k in total:
            total[k] += r[k]
    if len(rows) > 1:
        out.append(_line("all", total))
    return "\n".join(out)


def _line(module: str, r: dict) -> str:
    score = 100.0 * (r["killed"] + r["timeout"]) / r["mutants"] if r["mutants"] else float("nan")
    return (f"| {module} | {r['mutants']} | {r['killed']} | {r['survived']} | {r['timeout']} "
            f"| {r['other']} | {score:.1f}% |")


def report(work: Path, diffs: bool, label: str) -> dict[str, dict]:
    """Print :func:`tally`'s table of the copy ``work`` and each survivor (with its diff)."""
    rows = tally(work)
    print(table(rows))
    if rows and not any(r["killed"] + r["survived"] + r["timeout"] for r in rows.values()):
        # mutmut's first, unmutated run failed ("failed to collect stats"): no mutant was tried,
        # and a table of zeros must not pass for a score (nor every mutant be listed as a survivor)
        sys.exit(f"tools/mutation.py: {label}: no mutant was run; the tests fail on the unmutated "
                 f"code in the copy (see pytest's output above); fix that first. Copy: {work}")
    shown = survivor_diffs(work, rows) if diffs else {}
    for module, r in rows.items():
        for survivor in r["survivors"]:
            print(f"\n-- survived: {survivor}")
            if diffs:
                print(shown.get(survivor.split(" ")[0], "").rstrip())
    return rows


def run_scope(name: str, keep: bool, diffs: bool, workdir: Path | None) -> None:
    globs, tests = SCOPES[name]
    mutmut_exe()
    work = Path(tempfile.mkdtemp(prefix=f"hpcfl-mutation-{name}-", dir=workdir))
    copy_tree(work)
    write_config(work, globs, tests)
    print(f"== scope {name}: mutating {' '.join(globs)}\n   tests {' '.join(tests)}\n   in {work}", flush=True)
    t0 = time.perf_counter()
    mutmut(work, "run")
    print(f"\n== scope {name}: {time.perf_counter() - t0:.0f} s\n")
    report(work, diffs, f"scope {name}")
    if keep:
        print(f"\nscratch copy kept: {work} (cd there, then `mutmut show NAME` / `mutmut run NAME`)")
    else:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scopes", nargs="*", default=["parallel"], help=f"scopes, or all: {', '.join(SCOPES)}")
    ap.add_argument("--list", action="store_true", help="print the scopes and exit")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    ap.add_argument("--no-diffs", action="store_true", help="list the survivors without their diffs")
    ap.add_argument("--workdir", type=Path, help="where the scratch copy goes (default: the system's temp folder)")
    ap.add_argument("--report", type=Path, metavar="COPY",
                    help="print the table and survivors of a kept copy as it stands (after `mutmut run NAME ...` "
                         "there, say) and exit")
    args = ap.parse_args(argv)
    if args.report:
        if not (args.report / "mutants").is_dir():
            ap.error(f"--report {args.report}: not a kept copy (no mutants/ folder in it)")
        report(args.report, not args.no_diffs, str(args.report))
        return 0
    if args.list:
        for name, (globs, tests) in SCOPES.items():
            print(f"{name}:\n  mutate {' '.join(globs)}\n  tests  {' '.join(tests)}")
        return 0
    names = list(SCOPES) if args.scopes == ["all"] else args.scopes
    unknown = [n for n in names if n not in SCOPES]
    if unknown:
        ap.error(f"unknown scope {', '.join(unknown)}: choose from {', '.join(SCOPES)} or all")
    problems = check_scopes()
    if problems:
        ap.error("; ".join(problems) + " (fix SCOPES in tools/mutation.py)")
    for name in names:
        run_scope(name, args.keep, not args.no_diffs, args.workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
