"""The source's shape: imports between wtx modules flow one way, and classes stay small."""

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src" / "wtx"
MAX_CLASS_LINES = 250


def modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text()) for p in sorted(SOURCE.glob("*.py")) if p.stem != "__init__"}


def wtx_imports(tree: ast.Module) -> set[str]:
    """The wtx modules a module imports anywhere in it, at the top or inside a function."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "wtx":
            parts = node.module.split(".")
            found |= {parts[1]} if len(parts) > 1 else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("wtx.")}
    return found


def test_no_import_cycle():
    graph = {name: wtx_imports(tree) & set(modules()) for name, tree in modules().items()}
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for imported in sorted(graph[name]):
            assert state.get(imported) != "open", f"import cycle: {' -> '.join(path + [imported])}"
            if imported not in state:
                visit(imported, path + [imported])
        state[name] = "done"

    for name in graph:
        if name not in state:
            visit(name, [name])


def test_no_class_over_the_limit():
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                assert lines <= MAX_CLASS_LINES, f"{name}.{node.name} has {lines} lines"


def test_only_the_compiled_runner_and_cache_touch_inductor():
    for name, tree in modules().items():
        text = ast.unparse(tree)
        if "torch._inductor" in text or "torch.compile(" in text:
            assert name in ("compiled", "compile_cache"), f"{name} touches Inductor"


def test_the_plain_modules_import_no_torch():
    """The scheduler, segments, word rules, subtitles, transcripts and options are plain Python."""
    import subprocess
    import sys

    modules = ["wtx.streams", "wtx.segments", "wtx.words", "wtx.subtitles", "wtx.transcript", "wtx.writers", "wtx.options",
               "wtx.chunks", "wtx.cluster", "wtx.bytecode"]  # fmt: skip
    code = f"import sys; import {', '.join(modules)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
