"""The session core and the protocol type every callable they take or keep: no
``Callable[..., X]`` and no ``Any`` in a callable's signature (mypy's overrides in
pyproject.toml check the rest: generics parameterised, every def typed)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _callables_with_any(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Callable"):
            names = {n.id for n in ast.walk(node.slice) if isinstance(n, ast.Name)}
            loose = any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(node.slice))
            if "Any" in names or loose:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_callable_in_the_core_or_the_protocol_is_typed_with_any():
    files = sorted((ROOT / "actors" / "core").glob("*.py")) + sorted(
        (ROOT / "actors" / "protocol").glob("*.py")
    )
    assert len(files) > 10
    assert [hit for path in files for hit in _callables_with_any(path)] == []


def test_the_check_finds_a_loose_callable(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from typing import Any, Callable\nf: Callable[..., int]\ng: Callable[[Any], int]\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(_callables_with_any(bad)) == 2
    finally:
        ROOT = saved
