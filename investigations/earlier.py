"""Measure a module of this checkout against the same module as of an earlier commit, in
one process (the modules read with ``git show``), round by round."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load(path: Path, name: str) -> ModuleType:
    """The module at ``path``, imported as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def earlier_module(commit: str, path: str, name: str) -> ModuleType:
    """This repository's module at ``path`` as of ``commit``."""
    text = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / f"{name}.py"
        file.write_text(text)
        return load(file, name)


def compare(
    doc: str,
    path: str,
    against: str,
    earlier_ms: Callable[[ModuleType], float],
    this_ms: Callable[[ModuleType], float],
) -> None:
    """The command line (``--against``, default ``against``; ``--rounds``): each round prints
    ``earlier_ms`` of the earlier commit's ``path`` and ``this_ms`` of this checkout's."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--against", default=against, help="the earlier commit")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    stem = Path(path).stem
    earlier = earlier_module(args.against, path, f"{stem}_earlier")
    this = load(REPO / path, f"{stem}_this")
    for r in range(args.rounds):
        a, b = earlier_ms(earlier), this_ms(this)
        print(f"round {r + 1}: {args.against} {a:.3f} ms a turn, this checkout {b:.3f} ms a turn")
