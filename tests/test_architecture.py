"""The layering of docs/architecture.md: no modules of src/spikefuse import each other in a loop
(imports inside functions included, TYPE_CHECKING ones not), which import-linter's layers
contract (`lint-imports`, run by .ci/run) does not check inside a layer; and every module
belongs to a layer of that contract."""
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

grimp = pytest.importorskip("grimp")  # import-linter's graph; the test extra installs it

ROOT = Path(__file__).resolve().parents[1]


def graph():
    return grimp.build_graph("spikefuse", exclude_type_checking_imports=True)


def import_loops(g) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, loops = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for module in sorted(g.modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return loops


def test_no_module_imports_in_a_loop():
    assert import_loops(graph()) == []


def test_the_loop_finder_finds_a_loop():
    class Fake:
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        modules = set(edges)

        def find_modules_directly_imported_by(self, m):
            return self.edges[m]
    assert import_loops(Fake()) == [["a", "b", "c"]]


def test_every_module_is_in_a_layer():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = config["contracts"]
    layers = [name.strip() for layer in contract["layers"] for name in layer.replace(":", "|").split("|")]
    unplaced = sorted(m for m in graph().modules
                      if m != "spikefuse" and not any(m == l or m.startswith(l + ".") for l in layers))
    assert unplaced == [], f"place these in pyproject's [tool.importlinter] layers: {unplaced}"

