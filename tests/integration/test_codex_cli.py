"""Codex CLI (``@openai/codex``, pinned in tests/clients/package.json; ``make clients``)
against the real server, over WebSocket and over HTTP: ``codex exec --json`` with the
provider config of tests/clients/codex/config.toml, several prompts, the emulated model
calling Codex's own tools (its shell, its goals…) for many rounds.

Each run must end in ``turn.completed`` with a final agent message and no error event;
every response Codex used went over the transport asked for (the server's usage ledger
says so — no WebSocket→HTTP fallback); the checkout Codex worked in is unchanged (the
scripted model's calls are safe, docs/emulator.md); and Codex tried to reach nothing but
the server (every other connection goes to a local proxy that refuses and records it).
"""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import LEDGERED_TOOL_ROUNDS
from tests.support.codex import (
    CODEX,
    Egress,
    codex_home,
    rollout_records,
    run_codex,
    snapshot,
    write_checkout,
)
from tests.support.waiting import wait_until

ROUNDS = LEDGERED_TOOL_ROUNDS  # tool calls per prompt before the model answers
PROMPTS = (
    "List the files here and read the README.",
    "Set a goal to make the parser tests pass, then fix the failing test.",
    "Apply a patch that renames the helper in src/utils/io.py.",
)
# A small checkout with the files the scripted model's paths name (inference/emulator/schema_values.py).
CHECKOUT = {
    "README.md": "# demo\n\nA checkout Codex works in during the test.\n",
    "pyproject.toml": '[project]\nname = "demo"\nversion = "0.1.0"\n',
    "src/main.py": "print('hello')\n",
    "src/utils/io.py": "def helper():\n    return 1\n",
    "tests/test_parser.py": "def test_parser():\n    assert True\n",
    "docs/guide.md": "Guide.\n",
}


@pytest.fixture(scope="module")
def codex_server(ledgered_server):
    """The session's ledgered server (tests/conftest.py): a ledger in a temp directory, the
    model calling tools for ``ROUNDS`` rounds."""
    if not CODEX.exists():
        pytest.fail(f"{CODEX} is missing: run `make clients`", pytrace=False)
    return ledgered_server


@pytest.fixture(scope="module")
def egress():
    proxy = Egress()
    yield proxy
    proxy.close()


def ledger(path: Path, response_ids: set[str]) -> dict[str, str]:
    """The transport the server's usage ledger recorded for each of ``response_ids``."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT response_id, transport FROM usage").fetchall()
    return {rid: transport for rid, transport in rows if rid in response_ids}


@pytest.mark.parametrize("transport", ["websocket", "http"])
def test_codex_exec_completes_its_turns_over_each_transport(transport, codex_server, egress, tmp_path):
    url, store = codex_server
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    write_checkout(workdir, CHECKOUT)
    before = snapshot(workdir)
    home = codex_home(tmp_path, url, websockets=transport == "websocket")
    times = []
    for prompt in PROMPTS:
        run = run_codex(home, workdir, prompt, egress, key=f"sk-codex-{transport}")
        assert run.returncode == 0, f"codex exited {run.returncode}; stderr:\n{run.stderr[-3000:]}"
        events = run.events
        times.append(round(run.took_s, 1))
        kinds = [e["type"] for e in events]
        items = [e["item"] for e in events if e["type"] == "item.completed"]
        assert kinds[-1] == "turn.completed" and "turn.failed" not in kinds and "error" not in kinds, kinds
        assert not [i for i in items if i["type"] == "error"], items
        assert items[-1]["type"] == "agent_message" and items[-1]["text"]
    records = rollout_records(home)
    calls = Counter(
        r["payload"]["name"]
        for r in records
        if r["type"] == "response_item" and r["payload"].get("type") in ("function_call", "custom_tool_call")
    )
    print(f"codex exec over {transport}: {times} s for {len(PROMPTS)} prompts; calls {dict(calls)}")
    assert calls["exec_command"] >= 1, calls  # Codex's shell tool
    assert calls["apply_patch"] >= 1, calls  # its patch tool (freeform: a custom tool call)
    assert calls["create_goal"] + calls["get_goal"] + calls["update_goal"] >= 1, calls  # its goals
    assert sum(calls.values()) >= len(PROMPTS) * ROUNDS, calls

    # Every response Codex used is in the server's ledger under the transport asked for.
    used = {r["payload"]["response_id"] for r in records if r["type"] == "token_usage_record"}
    assert len(used) >= len(PROMPTS) * (ROUNDS + 1)
    seen = wait_until(
        lambda: (lambda got: got if len(got) == len(used) else None)(ledger(store, used)),
        timeout_s=20,
        what="the ledger lines of Codex's responses",
    )
    assert set(seen.values()) == {transport}, Counter(seen.values())

    assert snapshot(workdir) == before  # nothing overwritten, deleted or added
    assert egress.seen == []  # Codex reached nothing but the server
    shutil.rmtree(home / "sessions")
