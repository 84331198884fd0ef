"""The house rules, checked on the source: imports only run downward (plugins know no edge or export; edge knows
no export; the runtime's rooms know no analysis or command-line code), a chat never loads the research code or its
packages, and no module grows past the size a reader can hold."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("plugins", "edge", "export")
# The device runtime: everything a chat or an engine needs. Research (edge.analysis) and commands (edge.cli) sit above.
RUNTIME = ("edge.model", "edge.decode", "edge.backends", "edge.memory", "edge.energy", "edge.checks", "edge.engine",
           "edge.errors", "edge.atomic", "edge.cache", "edge.llm")
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def _imports(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` names, at any depth (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _under(name: str, roots) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


RULES = [  # (modules the rule covers, modules they must not import, why)
    (("plugins",), ("edge", "export"), "plugins know no edge or export"),
    (("edge",), ("export",), "edge knows no export"),
    (RUNTIME, ("edge.analysis", "edge.cli", "edge.serve", "starlette", "uvicorn"),
     "the runtime knows no analysis, command-line or server code"),
    (("edge.cli",), ("edge.analysis",), "the runtime's commands know no research code"),
]


@pytest.mark.parametrize("covered, banned, why", RULES, ids=[r[2] for r in RULES])
def test_imports_run_downward(covered, banned, why):
    bad = [f"{m} imports {i}" for m, f in _modules().items() if _under(m, covered)
           for i in sorted(_imports(f)) if _under(i, banned)]
    assert not bad, f"{why}: " + "; ".join(bad)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (`from a import b` names a.b where that is a module, else a), every
    import counted: at the top, inside functions and under TYPE_CHECKING alike."""
    mods = _modules()
    return {m: {i for i in _imports(f) if i in mods and i != m} for m, f in mods.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_circle_through_a_lazy_import():
    """The finder itself, on a graph with a three-module circle beside an acyclic branch."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """No two modules import each other, directly or around a circle, even lazily: a circle means neither sits below
    the other, so neither can be read, tested or moved alone."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles (move what both need below both): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_a_chat_loads_no_research_code():
    probe = ("import sys, edge.cli.chat, edge.llm, edge.backends.cpu; "
             "bad = sorted(m for m in sys.modules if m.startswith('edge.analysis') or m.split('.')[0] in "
             "('matplotlib', 'scipy', 'export')); print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"a chat imports research or host code: {r.stdout.strip()} {r.stderr[-400:]}"


def test_the_python_api_loads_no_server_or_research_code():
    """`from edge import LLM` (and `import edge` alone loads nothing heavy): no ASGI stack, no research code."""
    probe = ("import sys, edge; heavy = sorted(m for m in ('torch', 'edge.llm') if m in sys.modules); "
             "from edge import LLM; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
             "('starlette', 'uvicorn', 'matplotlib', 'scipy', 'export') or m.startswith(('edge.serve', 'edge.analysis', "
             "'edge.cli'))); print(heavy, bad); sys.exit(1 if heavy or bad else 0)")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"import edge / from edge import LLM loads too much: {r.stdout.strip()} {r.stderr[-400:]}"


def test_modules_stay_readable():
    long = {m: n for m, f in _modules().items() if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules past {MAX_LINES} lines (split them): {long}"


def test_the_source_runs_on_jetpack6s_python_3_10():
    """JetPack 6 is Python 3.10: no module may use a later language feature or standard-library name (vermin's static
    detection: `tomllib`, `datetime.UTC`, `except*`, ...), except behind a guard marked `# novm`. (`tomllib` once kept
    the whole suite from collecting there.)"""
    pytest.importorskip("vermin", reason="vermin comes with the test extra: pip install -e .[test]")
    r = subprocess.run([sys.executable, "-c", "import sys; from vermin.main import main; sys.exit(main())",
                        "-t=3.10-", "--no-tips", "--violations", "--eval-annotations", *PACKAGES, "tests", "scripts"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"needs a Python newer than 3.10 (JetPack 6):\n{r.stdout[-2000:]}{r.stderr[-500:]}"
