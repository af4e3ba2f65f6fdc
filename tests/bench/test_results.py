"""The one results writer (bench/results.py): every file keeps the kind's own keys and adds a
``run`` block with the command, the time, the project version and the machine; every kind
writes through it, and the CLI starts the run it records."""

from __future__ import annotations

import ast
import json
import os
import platform
import sys
import types
from datetime import datetime
from importlib import metadata
from pathlib import Path

import psutil
import pytest

from bench import DEMO_MODULE, KINDS, results
from bench import commands as cli

KINDS_DIR = Path(results.__file__).parent / "kinds"


def test_the_file_holds_the_payload_unchanged_and_the_run_block(tmp_path):
    run = results.Run.start("responses-ws bench hotpath --turns 3")
    payload = {"command": run.command, "turn_ms": {"median": 1.25, "n": 3}, "rows": [1, 2]}
    path = results.write(tmp_path / "deep" / "hotpath.json", payload, run)
    written = json.loads(path.read_text())
    assert {k: v for k, v in written.items() if k != "run"} == payload
    block = written["run"]
    assert block["command"] == "responses-ws bench hotpath --turns 3"
    assert block["version"] == metadata.version("responses-ws")
    assert datetime.fromisoformat(block["started_at"]).timestamp() == pytest.approx(run.started_at, abs=1)
    assert block["duration_s"] >= 0
    machine = block["machine"]
    assert machine["cores"] == os.cpu_count()
    assert machine["memory_bytes"] == psutil.virtual_memory().total
    assert machine["platform"] == platform.platform()
    assert machine["python"] == platform.python_version()
    assert machine["ray"] == metadata.version("ray")
    assert len(machine["load_average_at_start"]) == 3
    assert all(x >= 0 for x in machine["load_average_at_start"])


def test_the_duration_runs_from_the_start_to_the_write():
    run = results.Run("c", started_at=1000.0, load_average=(0.5, 0.25, 0.754), machine={"cores": 2})
    block = run.record(now=1012.5)
    assert block["started_at"] == "1970-01-01T00:16:40+00:00"
    assert block["duration_s"] == 12.5
    assert block["machine"] == {"cores": 2, "load_average_at_start": [0.5, 0.25, 0.75]}


def test_a_payload_may_not_bring_its_own_run_block(tmp_path):
    with pytest.raises(ValueError, match="'run'"):
        results.write(tmp_path / "x.json", {"run": 1}, results.Run.start("c"))


def test_the_cli_starts_the_run_the_kind_records(tmp_path, monkeypatch):
    """A kind module as bench/__init__.py describes it, run by the real CLI path."""
    out = tmp_path / "k.json"
    kind = types.ModuleType("bench_test_kind", "A kind that writes one number.")
    kind.add_arguments = lambda p: p.add_argument("--n", type=int, default=1)

    def run(args):
        results.write(out, {"n": args.n}, args.run)
        return 0

    kind.run = run
    monkeypatch.setitem(sys.modules, "bench_test_kind", kind)
    assert cli.run_module("bench_test_kind", "responses-ws bench test", ["--n", "7"]) == 0
    written = json.loads(out.read_text())
    assert written["n"] == 7
    assert written["run"]["command"] == "responses-ws bench test --n 7"


@pytest.mark.parametrize(
    "module",
    [
        *(k.module for k in KINDS.values()),
        *(k.variant_module(v) for k in KINDS.values() for v in k.variant_names[1:]),
        DEMO_MODULE,
    ],
)
def test_every_kind_writes_its_results_through_the_writer(module):
    """No kind writes a file of its own: its JSON goes through results.write (which adds the
    run block), its plots through bench.plotting."""
    path = KINDS_DIR / (module.rsplit(".", 1)[-1] + ".py")
    tree = ast.parse(path.read_text())
    calls = {
        (n.func.value.id, n.func.attr)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
    }
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert ("results", "write") in calls, module
    assert not attrs & {"write_text", "write_bytes", "savefig", "dump"}, module
    assert "matplotlib" not in path.read_text(), module
