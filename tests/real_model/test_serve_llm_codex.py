"""Codex CLI (pinned, ``make clients``) runs its loop against the real model over a
WebSocket: ``codex exec`` with ``smollm2-135m`` on the Ray Serve LLM engine (the
``llm_url`` app, shared with test_serve_llm.py).

What a 135M model guarantees is little: it rarely writes a valid call to Codex's tools, and
what it answers is its own.  So the test asserts what is certain: the run completes (Codex
ends the turn with the model's message, no error event), every response Codex used went
over the WebSocket to this model, the engine generated at least the output tokens Codex
was billed for, and Codex reached nothing but the server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.real_model.conftest import MODEL, ray_engine_total
from tests.support.codex import CATALOG, CODEX, Egress, codex_home, rollout_records, run_codex, write_checkout
from tests.support.waiting import wait_until

PROMPT = "Say hello in one short sentence. Do not run any command."


def catalog_for(path: Path, context_window: int) -> Path:
    """Codex's model catalog (tests/clients/codex/models.json) with the real model in it."""
    entry = {
        **json.loads(CATALOG.read_text())["models"][0],
        "slug": MODEL,
        "display_name": MODEL,
        "description": "SmolLM2-135M-Instruct on vLLM's CPU build (docs/backends.md)",
        "context_window": context_window,
    }
    path.write_text(json.dumps({"models": [entry]}))
    return path


def test_codex_exec_runs_its_loop_against_the_real_model_over_a_websocket(llm_url, llm_backend, tmp_path):
    if not CODEX.exists():
        pytest.fail(f"{CODEX} is missing: run `make clients`", pytrace=False)
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    write_checkout(workdir, {"README.md": "# demo\n"})
    home = codex_home(
        tmp_path,
        llm_url,
        websockets=True,
        catalog=catalog_for(tmp_path / "models.json", llm_backend.engine_kwargs["max_model_len"]),
    )
    generated = ray_engine_total("generation_tokens")
    egress = Egress()
    try:
        run = run_codex(home, workdir, PROMPT, egress, key="sk-codex-real", timeout_s=900, model=MODEL)
    finally:
        egress.close()
    kinds = [e["type"] for e in run.events]
    assert run.returncode == 0, f"codex exited {run.returncode}: {kinds}\n{run.stderr[-3000:]}"
    items = [e["item"] for e in run.events if e["type"] == "item.completed"]
    assert kinds[-1] == "turn.completed" and "turn.failed" not in kinds and "error" not in kinds, kinds
    assert items and items[-1]["type"] == "agent_message" and items[-1]["text"].strip(), items

    records = rollout_records(home)
    used = {r["payload"]["response_id"] for r in records if r["type"] == "token_usage_record"}
    usage = run.events[-1]["usage"]  # turn.completed's: the turn's responses
    billed = usage["output_tokens"]
    print(
        f"codex exec against {MODEL}: {run.took_s:.1f} s, {len(used)} responses, {usage}; "
        f"answer {items[-1]['text'][:200]!r}"
    )
    assert used and billed > 0
    # The answer came from the engine: it generated at least what Codex was billed for
    # (its counter reaches Ray's metrics endpoint within the report interval).
    wait_until(
        lambda: ray_engine_total("generation_tokens") - generated >= billed,
        timeout_s=60,
        what="the engine's generated tokens to count Codex's output",
    )
    assert egress.seen == []  # Codex reached nothing but the server
