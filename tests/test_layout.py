"""The house rules, checked on the source: imports only run downward (plugins know no edge or export; edge knows
no export; the runtime's rooms know no analysis, option or server code; the engine room knows no backend, policy or
front door; export's lower rooms know no command), a child process a module starts counts as an import of what it
runs, every command is one module of export/commands/, the tools load through the one front door, γ's ceiling is
one constant, a chat never loads the research code or its packages, and no module grows past the size a reader can
hold (docs/architecture.md draws the rooms)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("plugins", "edge", "export")
# The device runtime: everything a chat or an engine needs. The analysis (edge.analysis), the commands' shared options
# (edge.options) and the server (edge.serve) sit above it; the commands (export.commands) above everything.
RUNTIME = ("edge.model", "edge.engine", "edge.decode", "edge.backends", "edge.memory", "edge.energy", "edge.checks",
           "edge.llm", "edge.errors", "edge.atomic", "edge.cache", "edge.argtypes", "edge.text_stream",
           "edge.phase_clock", "edge.corpora")
# Child-process entries a module runs with `python -m` (a worker, a check in a process of its own), not commands:
# every other `main` is a command's, in export/commands/.
CHILD_ENTRIES = ("edge.analysis.bench.process", "edge.checks.kernels", "export.trt.check")
MAX_LINES = 500
SCRIPT = re.compile(r"(?:.*/)?scripts/(\w+)\.py")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def _strings(node) -> list:
    """The string constants of a list, tuple or call's arguments, in order (None for anything else)."""
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else node.args if isinstance(node, ast.Call) else []
    return [i.value if isinstance(i, ast.Constant) and isinstance(i.value, str) else None for i in items]


def _path_parts(node) -> list:
    """The string constants of a `ROOT / "a" / "b"` chain."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _path_parts(node.left) + _path_parts(node.right)
    return [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else []


def child_imports(tree: ast.AST) -> set[str]:
    """What the child processes a module starts run, counted as imports: `python -m MODULE` (`-m export.commands
    NAME` runs export.commands.NAME), and `scripts/NAME.py` as `scripts.NAME` (a path in a command list or a path
    chain; the same words in a docstring or a message are no call)."""
    found = set()
    for node in ast.walk(tree):
        seq = _strings(node)
        for i, v in enumerate(seq[:-1]):
            if v == "-m" and seq[i + 1]:
                mod = seq[i + 1]
                if mod == "export.commands" and i + 2 < len(seq) and seq[i + 2]:
                    mod = f"export.commands.{seq[i + 2].replace('-', '_')}"
                found.add(mod)
        for v in seq:
            m = SCRIPT.fullmatch(v or "")
            if m:
                found.add(f"scripts.{m.group(1)}")
        parts = _path_parts(node)
        if "scripts" in parts and parts[-1].endswith(".py"):
            found.add(f"scripts.{parts[-1][:-3]}")
    return found


def _imports(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` names, at any depth (lazy imports included), and what the
    child processes it starts run (child_imports)."""
    tree = ast.parse(path.read_text(), str(path))
    found = child_imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _under(name: str, roots) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


# export's top floor: the commands and the tools they run (a tool may run a command in a child: the fuzzer runs every
# one, the device check's GPTQ section runs the export); the exporter's own rooms sit below both
TOP = ("export.commands", "export.tools")
EXPORT_BELOW_TOP = tuple(sorted({".".join(m.split(".")[:2]) for m in _modules() if m.startswith("export.")} - set(TOP)))
RULES = [  # (modules the rule covers, modules they must not import, why)
    (("plugins",), ("edge", "export", "scripts"), "plugins know no edge or export"),
    (("edge",), ("export", "scripts"), "edge knows no export"),
    (("export",), ("scripts",), "no package runs a script: a child process runs a command's module"),
    (RUNTIME, ("edge.analysis", "edge.options", "edge.serve", "starlette", "uvicorn"),
     "the runtime knows no analysis, option or server code"),
    (("edge.model",), ("edge.engine", "edge.decode", "edge.backends", "edge.memory", "edge.energy", "edge.llm"),
     "the model reader knows no engine, policy or backend"),
    (("edge.engine",), ("edge.backends", "edge.decode", "edge.llm", "edge.memory", "edge.energy"),
     "the engine room knows no backend, policy, planner or front door"),
    (("edge.decode",), ("edge.backends", "edge.llm"), "policies drive the Engine interface, never a backend"),
    (("edge.backends",), ("edge.decode", "edge.llm"), "backends know no policy"),
    (("edge.serve",), ("edge.analysis", "edge.options"), "the server knows no analysis or command-line code"),
    (("edge.analysis",), ("edge.serve",), "the analysis knows no server"),
    (EXPORT_BELOW_TOP, TOP, "the exporter's rooms know no command or tool (they sit on top)"),
]


@pytest.mark.parametrize("covered, banned, why", RULES, ids=[r[2] for r in RULES])
def test_imports_run_downward(covered, banned, why):
    bad = [f"{m} imports {i}" for m, f in _modules().items() if _under(m, covered)
           for i in sorted(_imports(f)) if _under(i, banned)]
    assert not bad, f"{why}: " + "; ".join(bad)


def test_a_child_process_counts_as_an_import():
    """The finder itself: `-m MODULE`, `-m export.commands NAME` and a script path in a command or a path chain are
    imports; a script named in a docstring or an error message is not."""
    tree = ast.parse('''"""Runs scripts/export.py."""
subprocess.run([sys.executable, "-m", "export.trt.check", "--json"])
subprocess.run([sys.executable, "-u", "-m", "export.commands", "device-check", "--dry"])
EXPORT = (sys.executable, "scripts/export.py")
cmd = [sys.executable, str(ROOT / "scripts" / "evaluate.py")]
raise BitNestError("export one with `python scripts/export.py --out DIR`")
''')
    assert child_imports(tree) == {"export.trt.check", "export.commands.device_check", "scripts.export",
                                   "scripts.evaluate"}


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
    """`bitnest chat` imports its command module and the runtime, never the analysis, the research tools, the
    exporter (imported only where no checkpoint was given) or their packages."""
    probe = ("import sys, export.commands.chat, edge.llm, edge.backends.cpu; "
             "bad = sorted(m for m in sys.modules if m.startswith('edge.analysis') or m.split('.')[0] in "
             "('matplotlib', 'scipy') or m.startswith('export.') and m not in ('export.commands', "
             "'export.commands.chat')); print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"a chat imports research or host code: {r.stdout.strip()} {r.stderr[-400:]}"


def test_the_python_api_loads_no_server_or_research_code():
    """`from edge import LLM` (and `import edge` alone loads nothing heavy): no ASGI stack, no research code."""
    probe = ("import sys, edge; heavy = sorted(m for m in ('torch', 'edge.llm') if m in sys.modules); "
             "from edge import LLM; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
             "('starlette', 'uvicorn', 'matplotlib', 'scipy', 'export') or m.startswith(('edge.serve', 'edge.analysis', "
             "'edge.options'))); print(heavy, bad); sys.exit(1 if heavy or bad else 0)")
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


def test_every_command_is_one_module_of_export_commands():
    """Each `bitnest` command is export/commands/NAME.py with its `parser` and `main`, the table names every module
    there, and no other module holds a `main` but the child-process entries: a newcomer finds a command in one
    place."""
    from export.commands import COMMANDS, command_module
    mods = _modules()
    folder = {m for m in mods if m.startswith("export.commands.") and m != "export.commands.__main__"}
    assert folder == {command_module(n) for n in COMMANDS}, "export/commands/ holds a module no command names, or " \
        f"a command has no module: {sorted(folder ^ {command_module(n) for n in COMMANDS})}"
    for name in COMMANDS:
        tree = ast.parse(mods[command_module(name)].read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"parser", "main"} <= defined, f"{command_module(name)} lacks parser() or main()"
    stray = [m for m, f in mods.items() if not m.startswith("export.commands") and m not in CHILD_ENTRIES and
             any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(f.read_text()).body)]
    assert not stray, f"a command's main outside export/commands/ (move it there): {stray}"


def test_the_tools_load_through_the_front_door():
    """LLM (edge.llm) is the one way in: no module outside edge/llm.py builds or imports its internal loader."""
    bad = [m for m, f in _modules().items() if m != "edge.llm" and re.search(r"(?<![\w.])Runtime\(|import Runtime\b|"
                                                                            r"llm\.Runtime\b", f.read_text())]
    assert not bad, f"these build the internal Runtime: use edge.llm.LLM: {bad}"


def test_gammas_ceiling_is_one_constant():
    """No module compares a γ with a literal: the ceiling is edge.engine.MAX_PROPOSALS, written once."""
    bad = []
    for m, f in _modules().items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Compare) and "gamma" in ast.unparse(node) and any(
                    isinstance(c, ast.Constant) and c.value == 16 for c in [node.left, *node.comparators]):
                bad.append(f"{m}:{node.lineno}")
    assert not bad, f"γ compared with a literal 16 (use edge.engine.MAX_PROPOSALS): {bad}"
