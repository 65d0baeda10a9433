"""tools/mutation_shell.py's mutant generator: the exact mutants of a small script, comments and
quoted text untouched, ids fixed by line order."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutation_shell", ROOT / "tools" / "mutation_shell.py")
ms = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ms)

SCRIPT = """# exit 3 && [ -n x ] -eq
f() {
    [ -f "$1" ] && return 0   # -lt 7 || here
    echo "exit 4 -eq 1024" >&2
    exit 2
}
"""


def changed(m):
    """The one changed line of a mutant of SCRIPT."""
    new = m["text"].splitlines()
    return [n for o, n in zip(SCRIPT.splitlines(), new) if o != n]


def test_exact_mutants(tmp_path):
    (tmp_path / "s.sh").write_text(SCRIPT)
    got = [(m["id"], m["line"], m["rule"], changed(m)) for m in ms.mutants((tmp_path / "s.sh").read_text())]
    assert got == [
        ("srun_1", 3, "logic", ['    [ -f "$1" ] || return 0   # -lt 7 || here']),
        ("srun_2", 3, "return", ['    [ -f "$1" ] && return 1   # -lt 7 || here']),
        ("srun_3", 3, "file-negate", ['    [ ! -f "$1" ] && return 0   # -lt 7 || here']),
        ("srun_4", 3, "file-drop", ['    true && return 0   # -lt 7 || here']),
        ("srun_5", 3, "delete", ["    :"]),
        ("srun_6", 4, "delete", ["    :"]),
        ("srun_7", 5, "exit", ["    exit 3"]),
        ("srun_8", 5, "delete", ["    :"]),
    ]


def test_comment_lines_and_quotes_untouched():
    for m in ms.mutants(SCRIPT):
        assert m["text"].splitlines()[0] == SCRIPT.splitlines()[0]       # the comment line
        assert '"exit 4 -eq 1024"' in m["text"] or m["rule"] == "delete"  # the message


def test_split_code_drops_comment_tail_not_parameter_length():
    assert ms.split_code('if [ "${#1}" -le 6 ]; then  # why')[0] == 'if [ "${#1}" -le 6 ]; then'


def test_continued_command_not_deleted():
    text = "if [ 1 -eq 1 ] ||\n   [ 2 -eq 2 ]; then\n    x=1\nfi\n"
    deleted = [m["line"] for m in ms.mutants(text) if m["rule"] == "delete"]
    assert deleted == [3]


def test_ids_stable_for_the_real_script():
    text = (ROOT / ms.TARGET).read_text()
    a, b = ms.mutants(text), ms.mutants(text)
    assert [(m["id"], m["line"], m["text"]) for m in a] == [(m["id"], m["line"], m["text"]) for m in b]
    assert [m["id"] for m in a] == [f"srun_{i}" for i in range(1, len(a) + 1)]
