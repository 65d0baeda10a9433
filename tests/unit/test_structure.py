"""The transport layer (MPI, the exact sums, the state declarations) sits below the algorithms: it
imports nothing from hpcfl.algorithms, and its modules import each other without a circle."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "hpcfl"
TRANSPORT = ["state", "parallel/mpi", "parallel/gridsum", "parallel/gridsum_torch", "parallel/comm"]
BELOW = {"errors", "native"}   # leaf modules the transport may use


def imports(module: str) -> set[str]:
    """hpcfl modules that ``module`` imports anywhere (module level or inside functions)."""
    tree = ast.parse((PKG / f"{module}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = module.split("/")[:-1][: len(module.split("/")) - node.level]
            names = [node.module] if node.module else [a.name for a in node.names]
            for n in names:
                parts = base + n.split(".")
                full = "/".join(parts[:2]) if parts[0] == "parallel" else parts[0]
                out.add(full)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpcfl."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("hpcfl.")}
    return out


def test_the_transport_imports_nothing_from_the_algorithms():
    for m in TRANSPORT:
        assert imports(m) <= set(TRANSPORT) | BELOW, (m, imports(m))


def test_no_import_circle_in_the_transport():
    graph = {m: imports(m) & set(TRANSPORT) for m in TRANSPORT}
    done, path = set(), []

    def visit(m):
        assert m not in path, f"import circle: {' -> '.join(path[path.index(m):] + [m])}"
        if m in done:
            return
        path.append(m)
        for n in sorted(graph[m]):
            visit(n)
        path.pop()
        done.add(m)

    for m in TRANSPORT:
        visit(m)
    assert "parallel/gridsum" in graph["parallel/comm"] and "parallel/comm" not in graph["parallel/gridsum"]   # the circle this replaced
