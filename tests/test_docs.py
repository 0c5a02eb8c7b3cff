"""The docs cite only tests that exist: a case listed in docs/robustness.md names its test."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"`?(tests/[\w/]+\.py)::(\w+)")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_test_the_docs_cite_exists():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for doc in docs:
        for file, name in CITED.findall(doc.read_text()):
            path = ROOT / file
            if not path.is_file() or name not in _tests_in(path):
                missing.append(f"{doc.name}: {file}::{name}")
    assert not missing, "cited tests that do not exist:\n" + "\n".join(missing)


def test_the_robustness_table_cites_a_test_on_every_row():
    rows = [line for line in (ROOT / "docs" / "robustness.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| input or fault")]  # fmt: skip
    cells = [row.rstrip(" |").rsplit(" | ", 1)[-1] for row in rows]  # the last column
    uncited = [
        row[:80]
        for row, cell in zip(rows, cells)
        if not cell.startswith(("`tests/", "same", "`..."))
    ]
    assert rows and not uncited, f"rows without a test: {uncited}"
