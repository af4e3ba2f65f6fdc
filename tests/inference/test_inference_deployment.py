"""deployment: the Serve wrapper, exercised as a plain class (no cluster), and the import rule."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from inference import chat_format as cf
from inference.profiles import load_inference_config
from inference.types import Done, InferenceRequest, Prefilled

PACKAGE = Path(__file__).resolve().parents[2] / "inference"


def imported_top_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_deployment_module_imports_ray():
    importing = {p.name for p in PACKAGE.glob("*.py") if "ray" in imported_top_modules(p)}
    assert importing == {"deployment.py"}


def test_inference_never_imports_the_layers_above_it():
    for p in PACKAGE.glob("*.py"):
        assert not imported_top_modules(p) & {"actors", "serve"}, p.name


def test_nothing_in_inference_calls_bind():
    # The app builder in serve/ is the one composition root.
    for p in PACKAGE.glob("*.py"):
        calls = [
            n for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "bind"
        ]
        assert not calls, p.name


def test_replica_class_streams_lists_models_and_reports_stats():
    from inference.deployment import InferenceDeployment

    cfg = load_inference_config()
    replica = InferenceDeployment.func_or_class(cfg.model_dump())  # dict config, as YAML args
    req = InferenceRequest("r", "emu-fast", cf.render_message("user", "hi"), session_key="s")

    async def main():
        chunks = [chunk async for chunk in replica.generate(req)]
        return chunks, await replica.models(), await replica.stats()

    chunks, models, stats = asyncio.run(main())
    assert isinstance(chunks[0][0], Prefilled) and isinstance(chunks[-1][-1], Done)
    assert [m["id"] for m in models] == ["emu-fast", "emu-gpu"]
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in models)
    assert stats["completed"] == 1 and stats["replica"] is None
