"""The package's layout: every module in a layer of docs/architecture.md, no import from a higher
layer, and no import circle anywhere (imports inside functions count: they must not dodge one).

The layers are read from the table in docs/architecture.md ("Layers"), so the drawing there and
this test cannot drift apart.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def modules(pkg: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under ``pkg`` (a package is its __init__)."""
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(pkg: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its file (module level, inside
    functions, under ``if TYPE_CHECKING``). ``from P import name`` is an edge to the submodule
    ``P.name`` where there is one, else to ``P`` itself."""
    mods = modules(pkg)
    top = pkg.name
    graph = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t != top and not t.startswith(top + "."):
                    continue
                while t not in mods and "." in t:   # hpcfl.x.y where y is a name in hpcfl.x
                    t = t.rsplit(".", 1)[0]
                if t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path per import circle, e.g. ['a', 'b', 'a'] (depth-first, each circle found once per entry)."""
    found, state, path = [], {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                found.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def read_layers(doc: Path, top: str = "hpcfl") -> dict[str, int]:
    """Module prefix -> layer number, from the fenced block after the "<!-- layers -->" marker:
    a line ``N  name/ other.py ...`` names layer N's packages (a trailing /) and root modules; the
    indented lines after it say what they hold."""
    text = doc.read_text()
    block = text.split("<!-- layers -->", 1)[1].split("```", 2)[1]
    layers = {}
    for line in block.splitlines():
        m = re.fullmatch(r"\s*(\d+)\s+((?:[\w.]+/? )*[\w.]+/?)\s*", line)
        if not m:
            continue
        for token in m.group(2).split():
            stem = token.rstrip("/").removesuffix(".py")
            layers[top if stem == "__init__" else f"{top}.{stem}"] = int(m.group(1))
    return layers


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    while module not in layers and "." in module:
        module = module.rsplit(".", 1)[0]
    return layers.get(module) if module in layers else None


def upward(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Imports from a lower layer into a higher one, as 'a (layer i) imports b (layer j)'."""
    out = []
    for m, edges in sorted(graph.items()):
        for n in sorted(edges):
            i, j = layer_of(m, layers), layer_of(n, layers)
            if i is not None and j is not None and j > i:
                out.append(f"{m} (layer {i}) imports {n} (layer {j})")
    return out


@pytest.fixture(scope="module")
def real():
    return import_graph(ROOT / "hpcfl"), read_layers(DOC)


def test_the_layer_table_is_read_from_the_docs(real):
    _, layers = real
    assert layers["hpcfl.cli"] > layers["hpcfl.engine"] > layers["hpcfl.io"] > layers["hpcfl.config"] \
        > layers["hpcfl.algorithms"] > layers["hpcfl.data"] > layers["hpcfl.parallel"] > layers["hpcfl.native"] \
        > layers["hpcfl.errors"]
    assert layers["hpcfl.algorithms"] == layers["hpcfl.client"]


def test_every_module_has_a_layer(real):
    graph, layers = real
    assert [m for m in graph if layer_of(m, layers) is None] == []


def test_the_root_keeps_only_entry_points_and_basics(real):
    graph, _ = real
    root = sorted(m for m in graph if m.count(".") == 1 and not (ROOT / "hpcfl" / m.split(".")[1]).is_dir())
    assert root == ["hpcfl.__main__", "hpcfl.api", "hpcfl.errors", "hpcfl.inputs", "hpcfl.params", "hpcfl.plugins",
                    "hpcfl.results", "hpcfl.rng", "hpcfl.signals", "hpcfl.state", "hpcfl.version"]


def test_no_import_circle(real):
    graph, _ = real
    assert circles(graph) == []


def test_no_import_from_a_higher_layer(real):
    graph, layers = real
    assert upward(graph, layers) == []


def test_the_checks_find_a_planted_circle_and_an_upward_import(tmp_path):
    """A small package: low.a -> low.b -> low.a (a circle, one import inside a function), and
    low.b -> high (upward)."""
    pkg = tmp_path / "hpcfl"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("from . import b\n")
    (pkg / "low" / "b.py").write_text("def f():\n    from .a import g\n    from ..high import h\n")
    (pkg / "high.py").write_text("from .low.a import x\n")
    doc = tmp_path / "arch.md"
    doc.write_text("<!-- layers -->\n```\n 1  high.py\n      upper\n 0  low/ __init__.py\n      lower\n```\n")
    graph = import_graph(pkg)
    assert graph == {"hpcfl": set(), "hpcfl.high": {"hpcfl.low.a"}, "hpcfl.low": set(),
                     "hpcfl.low.a": {"hpcfl.low.b"}, "hpcfl.low.b": {"hpcfl.low.a", "hpcfl.high"}}
    assert circles(graph) == [["hpcfl.high", "hpcfl.low.a", "hpcfl.low.b", "hpcfl.high"],
                              ["hpcfl.low.a", "hpcfl.low.b", "hpcfl.low.a"]]
    assert upward(graph, read_layers(doc)) == ["hpcfl.low.b (layer 0) imports hpcfl.high (layer 1)"]
