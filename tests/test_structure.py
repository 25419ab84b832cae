"""The code stays walkable (issue 64, docs/architecture.md "Size rules"): no library file of `hf_deepnmt/` or
`training/` over 1,000 lines, no server module over 400, and no function whose body runs over 80 lines.

A function's length is counted from its first statement after the docstring to its last line: a signature that lists
a configuration's fields one per line (`DeepTransformerConfig.__init__`) is a table, not a step to split.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = tuple(sorted(path for package in ("hf_deepnmt", "training") for path in (ROOT / package).rglob("*.py")))
MAX_FILE_LINES = 1000
MAX_SERVE_MODULE_LINES = 400
MAX_BODY_LINES = 80


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after ``function``'s docstring to its end (the docstring alone counts when it
    is the whole body)."""
    body = function.body
    has_docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str)
    first = body[1] if has_docstring and len(body) > 1 else body[0]
    start = min([first.lineno] + [decorator.lineno for decorator in getattr(first, "decorator_list", [])])
    return function.end_lineno - start + 1


def long_functions(source: str, limit: int = MAX_BODY_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, line, body lines) of each function in ``source`` whose body is longer than ``limit``."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if body_lines(child) > limit:
                    found.append((prefix + child.name, child.lineno, body_lines(child)))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_the_measure_sees_a_long_function_and_skips_the_signature_and_docstring():
    """The rule itself: 81 body lines fail, 80 pass, however long the signature and docstring."""
    signature = "def f(\n" + "".join(f"    a{i}: int = {i},\n" for i in range(40)) + ") -> None:\n"
    docstring = '    """' + "\n    doc" * 30 + '"""\n'
    long_body, ok_body = "".join(f"    x = {i}\n" for i in range(81)), "".join(f"    x = {i}\n" for i in range(80))
    assert long_functions(signature + docstring + long_body) == [("f", 1, 81)]
    assert long_functions(signature + docstring + ok_body) == []
    method = "class C:\n    def g(self):\n" + "".join(f"        y = {i}\n" for i in range(90))
    assert long_functions(method) == [("C.g", 2, 90)]


@pytest.mark.parametrize("path", LIBRARY, ids=[str(path.relative_to(ROOT)) for path in LIBRARY])
def test_each_library_file_is_short_and_its_functions_are_steps(path: Path):
    source = path.read_text(encoding="utf-8")
    lines = len(source.splitlines())
    limit = MAX_SERVE_MODULE_LINES if path.parent == ROOT / "training" / "serve" else MAX_FILE_LINES
    assert lines <= limit, f"{path.relative_to(ROOT)} has {lines} lines; the rule is at most {limit}"
    assert long_functions(source) == [], f"{path.relative_to(ROOT)}: functions over {MAX_BODY_LINES} lines"
