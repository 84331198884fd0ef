"""The docs stay true: every result table equals what its scripts/results/*.json gives (edge.analysis.report.tables), the
README's layout map names paths that exist and every room of edge/, and the paths and doc sections that the docs and
the code cite exist."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge.analysis.report import tables as report
from edge.analysis.report.tables import RESULTS, update_tables
from edge.errors import BitNestError
from export.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TOP = ("plugins", "export", "edge", "scripts", "tests", "docs")
# A repo path as the docs write it: a top-level folder, then path characters (placeholders like NAME are upper case).
REPO_PATH = re.compile(r"(?<![\w/.~-])((?:%s)/[\w./-]*[\w/])" % "|".join(TOP))


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def _layout_rows() -> dict[str, str]:
    """{folder: what it owns} from the README's layout map."""
    rows = {}
    for line in _section(README.read_text(), "Layout").splitlines():
        m = re.match(r"\| `([^`]+/)` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def _copy_docs(tmp: Path) -> Path:
    """README, docs/ and the results' JSON in a scratch root, so a test may edit them."""
    shutil.copy(README, tmp / "README.md")
    shutil.copytree(ROOT / "docs", tmp / "docs")
    (tmp / RESULTS).mkdir(parents=True)
    for f in (ROOT / RESULTS).glob("*.json"):
        shutil.copy(f, tmp / RESULTS / f.name)
    return tmp


# -- generated tables ---------------------------------------------------------------------------------------------
def test_every_table_matches_its_results():
    r = update_tables(ROOT, check=True)
    assert r["tables"], "no generated tables found in README.md or docs/"
    assert not r["stale"], f"tables differ from scripts/results (run `bitnest tables`): {r['stale']}"


def test_the_check_names_a_table_edited_by_hand(tmp_path, monkeypatch, capsys):
    root = _copy_docs(tmp_path)
    doc = root / "docs" / "precision-on-demand.md"
    text = doc.read_text()
    row = "| fixed γ = 4 | 72.3% |"
    assert row in text
    doc.write_text(text.replace(row, "| fixed γ = 4 | 82.3% |", 1))
    assert update_tables(root, check=True)["stale"] == ["docs/precision-on-demand.md:sweep-bitnest"]
    from export.commands import tables as command
    monkeypatch.setattr(command, "ROOT", root)
    assert command.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/precision-on-demand.md:sweep-bitnest" in err and len(err.strip().splitlines()) == 1
    assert command.main([]) == 0                           # rewriting restores the JSON's figure
    assert row in doc.read_text() and command.main(["--check"]) == 0


def test_the_check_names_every_table_of_a_changed_result(tmp_path):
    root = _copy_docs(tmp_path)
    path = root / RESULTS / "quality.json"
    data = json.loads(path.read_text())
    data["rtn"]["eval"]["agreement"]["code"] = 0.5
    path.write_text(json.dumps(data))
    assert update_tables(root, check=True)["stale"] == ["docs/quality.md:quality"]
    path = root / RESULTS / "replay-bitnest.json"
    data = json.loads(path.read_text())
    data["auc"]["margin"]["value"] = 0.5
    path.write_text(json.dumps(data))
    stale = update_tables(root, check=True)["stale"]
    assert {"README.md:headline", "docs/precision-on-demand.md:replay-bitnest",
            "docs/precision-on-demand.md:replay-exports"} <= set(stale), stale


def test_bad_markers_and_names_are_one_line_errors(tmp_path):
    root = _copy_docs(tmp_path)
    doc = root / "docs" / "quality.md"
    doc.write_text(doc.read_text() + "\n<!-- table:no-such-table -->\n<!-- /table:no-such-table -->\n")
    with pytest.raises(BitNestError, match="unknown table 'no-such-table'"):
        update_tables(root, check=True)
    doc.write_text(doc.read_text().replace("<!-- /table:no-such-table -->\n", ""))
    with pytest.raises(BitNestError, match="never closed"):
        update_tables(root, check=True)
    with pytest.raises(BitNestError, match="replay-nothing.json does not exist"):
        report.render("replay-nothing", root)


def test_the_command_checks_the_committed_docs():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_tables.py"), "--check", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["stale"] == []


# -- the layout map -----------------------------------------------------------------------------------------------
def test_every_path_in_the_layout_map_exists():
    rows = _layout_rows()
    missing = []
    for folder, owns in rows.items():
        if not (ROOT / folder).is_dir():
            missing.append(folder)
        for name in re.findall(r"`([\w./-]+\.\w+|[\w.-]+/)`", owns):
            path = ROOT / name if "/" in name.rstrip("/") else ROOT / folder / name
            if not path.exists():
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"the README's layout map names paths that do not exist: {missing}"


def test_the_layout_map_names_every_room():
    rows = _layout_rows()
    rooms = {f"{p.parent.relative_to(ROOT).as_posix()}/" for p in ROOT.glob("edge/*/__init__.py")}
    rooms |= {f"{t}/" for t in TOP} | {"plugins/kernels/"}
    assert not rooms - set(rows), f"the README's layout map leaves out {sorted(rooms - set(rows))}"


def test_the_readme_names_every_command_and_its_script():
    text = _section(README.read_text(), "Commands")
    missing = [n for n in COMMANDS if f"`bitnest {n}" not in text]
    assert not missing, f"commands missing from the README's command table: {missing}"
    wrong = []
    for commands, scripts in re.findall(r"^\| (`bitnest .*?) \| (`.*?\.py`) \|", text, re.M):
        names = re.findall(r"`bitnest ([\w-]+)", commands)
        files = re.findall(r"`([\w]+\.py)`", scripts)
        assert len(names) == len(files), f"commands and scripts do not pair up: {commands} | {scripts}"
        for name, file in zip(names, files):
            path = ROOT / "scripts" / file
            if not path.is_file() or f"from export.commands.{name.replace('-', '_')} import main" not in path.read_text():
                wrong.append(f"{name} -> scripts/{file}")
    assert not wrong, f"the README pairs commands with scripts that do not run them: {wrong}"


# -- citations ----------------------------------------------------------------------------------------------------
def test_paths_named_in_the_docs_exist():
    bad = []
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for path in REPO_PATH.findall(doc.read_text()):
            if not re.search(r"\b[A-Z]{2,}\b", path) and not (ROOT / path).exists():   # NAME, DIR: placeholders
                bad.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not bad, f"paths the docs name that do not exist: {bad}"


def test_links_and_images_resolve():
    bad = []
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)#\s:]+)(?:#([\w-]+))?\)", doc.read_text()):
            path = (doc.parent / target).resolve()
            if not path.is_file():
                bad.append(f"{doc.name} -> {target}")
            elif anchor and anchor not in {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-")
                                           for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}:
                bad.append(f"{doc.name} -> {target}#{anchor}")
    assert not bad, f"links to docs or sections that do not exist: {bad}"


def test_docs_the_code_cites_exist():
    """`docs/NAME.md` in a docstring or comment names a file of docs/; `docs/NAME.md, SECTION` a section of it (the
    section's first word starts a heading or a word of one)."""
    bad = []
    for src in sorted(p for d in ("plugins", "edge", "export", "scripts", "tests") for p in (ROOT / d).rglob("*.py")):
        for name, section in re.findall(r"docs/([a-z][a-z-]*\.md)(?:, ([A-Za-z][\w ]*))?", src.read_text()):
            doc = ROOT / "docs" / name
            if not doc.is_file():
                bad.append(f"{src.relative_to(ROOT)}: docs/{name}")
                continue
            first = section.split()[0].lower() if section else ""
            headings = [h.lower() for h in re.findall(r"^#+ (.*)$", doc.read_text(), re.M)]
            if first and not any(h.startswith(first) or f" {first}" in h for h in headings):
                bad.append(f"{src.relative_to(ROOT)}: docs/{name}, {section}")
    assert not bad, f"citations of docs that do not resolve: {bad}"
