"""Line-level mutation testing of slurm/hpcfl_srun.sh (mutmut mutates Python only).

Each mutant changes one thing on one line of the shell script: a comparison operator, ``&&``/``||``,
``[ -n``/``[ -z``, a ``-f``/``-L`` test negated or dropped, an integer literal +1, ``return 0``/``1``,
``exit N`` -> ``exit N+1``, or a whole one-line command replaced by ``:``. Comment lines and comment
tails are never touched, nor text inside quotes (messages are interface, but a changed number in a
message is not a changed behaviour). The repository is copied once into a scratch folder; each mutant
is written over slurm/hpcfl_srun.sh there, the covering tests run, the original is restored.

Usage::

    python tools/mutation_shell.py [--list] [--only ID ...] [--keep] [--workdir DIR] [--timeout S]

Ids (``srun_<n>``) follow line order, then rule order, then position on the line: they stay the same
as long as the script does, so the docs can cite them. Exit status 0 whatever the score.
"""

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = "slurm/hpcfl_srun.sh"
# every test here runs hpcfl_srun.sh through stand-ins for srun/scontrol: no Slurm cluster needed
TESTS = ["tests/e2e/test_slurm_requeue.py", "tests/e2e/test_slurm.py"]

# (rule name, pattern, replacement); applied to unquoted code only, each match a mutant of its own
SWAPS = [
    ("cmp", r"(?<=\s)-eq(?=\s)", "-ne"), ("cmp", r"(?<=\s)-ne(?=\s)", "-eq"),
    ("cmp", r"(?<=\s)-lt(?=\s)", "-le"), ("cmp", r"(?<=\s)-le(?=\s)", "-lt"),
    ("cmp", r"(?<=\s)-gt(?=\s)", "-ge"), ("cmp", r"(?<=\s)-ge(?=\s)", "-gt"),
    ("logic", r"&&", "||"), ("logic", r"\|\|", "&&"),
    ("empty", r"\[ -n(?=\s)", "[ -z"), ("empty", r"\[ -z(?=\s)", "[ -n"),
    ("return", r"\breturn 0\b", "return 1"), ("return", r"\breturn 1\b", "return 0"),
]
FILE_TEST = re.compile(r"\[ (! )?-([fL]) ([^\]]*)\]")
EXIT = re.compile(r"\bexit (\d+)\b")
# a bare integer: not part of a word/variable, not a file descriptor (2>, >&2), not after exit/return
# (their own rules), not an operand of `seq` either way it is still a number worth changing
INT = re.compile(r"(?<![\w$.&>-])(?<!exit )(?<!return )\d+(?![\w.>])")
# lines that are structure, not a command a mutant could delete
STRUCTURE = re.compile(r"^(\}|fi\b|done\b|esac\b|;;|then\b|else\b|do\b|while\b|if\b|for\b|case\b|"
                       r"[\w|' *\-]+\)\s*$|\w+\(\)\s*\{)")
CONTINUES = ("\\", "&&", "||", "|")


def split_code(line: str) -> tuple[str, list[tuple[int, int]]]:
    """The code part of ``line`` (comment tail dropped) and the unquoted spans of it as (start, end).

    A ``#`` opens a comment only outside quotes and at a word start (``$#``, ``${#x}`` are code);
    quotes are tracked so that ``'...'`` and ``"..."`` (messages, the trap's command) stay whole.
    """
    spans, quote, start, i = [], None, 0, 0
    while i < len(line):
        c = line[i]
        if quote is None:
            if c == "\\":
                i += 2
                continue
            if c == "#" and (i == 0 or line[i - 1] in " \t;"):
                break
            if c in "'\"":
                spans.append((start, i))
                quote = c
        elif c == "\\" and quote == '"':
            i += 2
            continue
        elif c == quote:
            quote, start = None, i + 1
        i += 1
    code = line[:i].rstrip()
    if quote is None:
        spans.append((start, len(code)))
    return code, [(a, min(b, len(code))) for a, b in spans if a < min(b, len(code))]


def line_mutants(line: str, prev_code: str) -> list[tuple[str, str]]:
    """Every (rule, mutated line) for one line of the script, in a fixed order."""
    code, spans = split_code(line)
    if not code.strip():
        return []
    out = []

    def each(pattern, make, rule):
        # matched on the whole code (a test like [ -f "$x" ] spans quotes), kept when it starts unquoted
        for m in re.finditer(pattern, code):
            if any(a <= m.start() < b for a, b in spans):
                out.append((rule, line[:m.start()] + make(m) + line[m.end():]))

    for rule, pattern, repl in SWAPS:
        each(pattern, lambda m, r=repl: r, rule)
    each(FILE_TEST, lambda m: f"[ {'' if m.group(1) else '! '}-{m.group(2)} {m.group(3)}]", "file-negate")
    each(FILE_TEST, lambda m: "true", "file-drop")
    each(INT, lambda m: str(int(m.group()) + 1), "int")
    each(EXIT, lambda m: f"exit {int(m.group(1)) + 1}", "exit")
    stripped = code.strip()
    # a one-line command only: deleting one line of a continued command would leave broken syntax
    if (not STRUCTURE.match(stripped) and not prev_code.rstrip().endswith(CONTINUES)
            and not stripped.endswith(CONTINUES) and "=(" not in stripped):
        indent = line[:len(line) - len(line.lstrip())]
        tail = " ;;" if stripped.endswith(";;") else ""
        out.append(("delete", f"{indent}:{tail}\n" if line.endswith("\n") else f"{indent}:{tail}"))
    return out


def mutants(text: str, prefix: str = "srun") -> list[dict]:
    """All mutants of a script's text: dicts with id, line (1-based), rule, text (the whole mutant)."""
    lines = text.splitlines(keepends=True)
    found, prev = [], ""
    for n, line in enumerate(lines):
        for rule, new in line_mutants(line, prev):
            if new != line:
                found.append({"line": n + 1, "rule": rule,
                              "text": "".join(lines[:n] + [new] + lines[n + 1:])})
        code, _ = split_code(line)
        if code.strip():
            prev = code
    for i, m in enumerate(found, 1):
        m["id"] = f"{prefix}_{i}"
    return found


def diff(original: str, mutant: dict) -> str:
    return "".join(difflib.unified_diff(original.splitlines(True), mutant["text"].splitlines(True),
                                        TARGET, f"{TARGET} ({mutant['id']})", n=1))


def copy_tree(dest: Path) -> None:
    """The repository's files as git sees them (tracked and untracked, not ignored) into ``dest``."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         check=True, capture_output=True).stdout
    for f in filter(None, out.decode().split("\0")):
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)


def run_tests(tree: Path, timeout: float, workers: int) -> str:
    """'killed', 'survived' or 'timeout' for the tree as it is now."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS]
    if workers > 1:   # -x with xdist still stops at the first failure (after the running tests)
        cmd += ["-n", str(workers)]
    try:
        p = subprocess.run(cmd, cwd=tree, capture_output=True, timeout=timeout,
                           env={**os.environ, "PYTHONPATH": str(tree)})
    except subprocess.TimeoutExpired:
        return "timeout"
    return "survived" if p.returncode == 0 else "killed"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants")
    ap.add_argument("--keep", action="store_true", help="keep the scratch tree")
    ap.add_argument("--workdir", type=Path, help="scratch folder (default: a new temporary one)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant's test run")
    ap.add_argument("-n", "--workers", type=int, default=1, help="pytest-xdist workers")
    args = ap.parse_args(argv)
    original = (ROOT / TARGET).read_text()
    todo = mutants(original)
    if args.only:
        unknown = set(args.only) - {m["id"] for m in todo}
        if unknown:
            ap.error(f"no such mutant(s): {', '.join(sorted(unknown))}; --list shows the ids")
        todo = [m for m in todo if m["id"] in args.only]
    if args.list:
        for m in todo:
            print(f"{m['id']} line {m['line']} ({m['rule']})\n{diff(original, m)}")
        return 0
    work = args.workdir or Path(tempfile.mkdtemp(prefix="hpcfl-mutation-shell-"))
    work.mkdir(parents=True, exist_ok=True)
    copy_tree(work)
    target = work / TARGET
    try:
        if run_tests(work, args.timeout, args.workers) != "survived":   # a table of kills would lie
            print("the covering tests fail (or time out) on the unmutated script; fix that first")
            return 0
        results = {}
        for m in todo:
            t0 = time.monotonic()
            target.write_text(m["text"])
            try:
                results[m["id"]] = run_tests(work, args.timeout, args.workers)
            finally:
                target.write_text(original)
            print(f"{m['id']} line {m['line']} {m['rule']}: {results[m['id']]} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    counts = {k: sum(v == k for v in results.values()) for k in ("killed", "survived", "timeout")}
    score = (counts["killed"] + counts["timeout"]) / max(len(todo), 1)
    print("\n| script | mutants | killed | survived | timeout | score |\n|---|---|---|---|---|---|")
    print(f"| {TARGET} | {len(todo)} | {counts['killed']} | {counts['survived']} | "
          f"{counts['timeout']} | {score:.1%} |")
    for m in todo:
        if results[m["id"]] == "survived":
            print(f"\n{m['id']} (line {m['line']}, {m['rule']}) survived:\n```diff\n{diff(original, m)}```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
