"""The dependency direction serve → actors → inference, and where Ray may be imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["inference", "actors", "serve"]  # a package may import only those before it
RAY_MODULES = {"inference/deployment.py", "actors/actor.py", "serve/gateway.py", "serve/builder.py"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_packages_only_import_downwards():
    for i, package in enumerate(ORDER):
        forbidden = set(ORDER[i + 1:])
        for path in (ROOT / package).glob("*.py"):
            assert not imports(path) & forbidden, f"{path.relative_to(ROOT)} imports {imports(path) & forbidden}"


def test_only_designated_modules_import_ray():
    for package in ORDER:
        for path in (ROOT / package).glob("*.py"):
            rel = str(path.relative_to(ROOT))
            if "ray" in imports(path):
                assert rel in RAY_MODULES, f"{rel} imports ray"


def _is_deployment_bind(node: ast.AST) -> bool:
    """``Deployment.bind(...)`` or ``Deployment.options(...).bind(...)`` (not ``socket.bind``)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bind"):
        return False
    target = node.func.value
    if isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute):
        return target.func.attr == "options"
    return isinstance(target, ast.Name) and target.id[:1].isupper()


def test_the_app_builder_is_the_only_bind_site():
    for package in ORDER:
        for path in (ROOT / package).glob("*.py"):
            binds = [n for n in ast.walk(ast.parse(path.read_text())) if _is_deployment_bind(n)]
            assert not binds or path.relative_to(ROOT).as_posix() == "serve/builder.py", path
