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

import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import string
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.server import start_app, stop_app, wait_for

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / "tests/clients/node_modules/.bin/codex"
CONFIG = ROOT / "tests/clients/codex/config.toml"
CATALOG = ROOT / "tests/clients/codex/models.json"
APP = "rws-codex"
ROUNDS = 24  # tool calls per prompt before the model answers
PROMPTS = (
    "List the files here and read the README.",
    "Set a goal to make the parser tests pass, then fix the failing test.",
    "Apply a patch that renames the helper in src/utils/io.py.",
)
# A small checkout with the files the scripted model's paths name (inference/schema_values.py).
CHECKOUT = {
    "README.md": "# demo\n\nA checkout Codex works in during the test.\n",
    "pyproject.toml": "[project]\nname = \"demo\"\nversion = \"0.1.0\"\n",
    "src/main.py": "print('hello')\n",
    "src/utils/io.py": "def helper():\n    return 1\n",
    "tests/test_parser.py": "def test_parser():\n    assert True\n",
    "docs/guide.md": "Guide.\n",
}


class Egress:
    """A local HTTP proxy that refuses every request and records its first line: Codex's
    ``HTTPS_PROXY``, so any attempt to reach a host other than the server shows here."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.seen.append(conn.makefile("rb").readline().decode(errors="replace").strip())
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self._sock.close()


@pytest.fixture(scope="module")
def codex_server(ray_cluster, tmp_path_factory):
    """A server of its own: a ledger in a temp directory, the model calling tools for
    ``ROUNDS`` rounds."""
    if not CODEX.exists():
        pytest.fail(f"{CODEX} is missing: run `make clients`", pytrace=False)
    data = tmp_path_factory.mktemp("codex-store")
    url = start_app(APP, **{"store.data_dir": str(data), "inference.policy.tool_rounds": ROUNDS})
    yield url, data / "responses.sqlite3"
    stop_app(APP)


@pytest.fixture(scope="module")
def egress():
    proxy = Egress()
    yield proxy
    proxy.close()


def write_checkout(path: Path) -> None:
    for name, text in CHECKOUT.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "start"]):
        subprocess.run([*git, *args], cwd=path, check=True, capture_output=True)


def snapshot(path: Path) -> dict[str, str]:
    """Every file under ``path`` but Git's own (``.git/``), with its SHA-256."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and ".git" not in p.relative_to(path).parts}


def codex_home(path: Path, base_url: str, websockets: bool) -> Path:
    home = path / "codex-home"
    home.mkdir()
    config = string.Template(CONFIG.read_text()).substitute(
        base_url=f"{base_url}/v1", websockets="true" if websockets else "false", catalog=str(CATALOG))
    (home / "config.toml").write_text(config)
    return home


def run_codex(home: Path, workdir: Path, prompt: str, egress: Egress, key: str) -> tuple[list[dict], float]:
    """``codex exec --json`` of one prompt; its events and wall time.  Codex runs without a
    sandbox, so only the scripted model's choices keep the checkout intact."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(CODEX_HOME=str(home), HOME=str(home), RESPONSES_WS_API_KEY=key,
               HTTPS_PROXY=egress.url, HTTP_PROXY=egress.url, ALL_PROXY=egress.url,
               NO_PROXY="127.0.0.1,localhost", NO_COLOR="1")
    cmd = [str(CODEX), "exec", "--json", "--strict-config", "--sandbox", "danger-full-access",
           "-c", 'approval_policy="never"', "-C", str(workdir), prompt]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # Codex and the commands it started
        out, err = proc.communicate()
        pytest.fail(f"codex exec did not finish in 60 s; stderr:\n{err[-3000:]}")
    assert proc.returncode == 0, f"codex exited {proc.returncode}; stderr:\n{err[-3000:]}\nstdout:\n{out[-3000:]}"
    return [json.loads(line) for line in out.splitlines() if line.strip()], time.monotonic() - start


def rollout_records(home: Path) -> list[dict]:
    """What Codex recorded of its session(s) (``$CODEX_HOME/sessions/…/rollout-*.jsonl``)."""
    return [json.loads(line) for f in sorted((home / "sessions").rglob("*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]


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
    write_checkout(workdir)
    before = snapshot(workdir)
    home = codex_home(tmp_path, url, websockets=transport == "websocket")
    times = []
    for prompt in PROMPTS:
        events, took = run_codex(home, workdir, prompt, egress, key=f"sk-codex-{transport}")
        times.append(round(took, 1))
        kinds = [e["type"] for e in events]
        items = [e["item"] for e in events if e["type"] == "item.completed"]
        assert kinds[-1] == "turn.completed" and "turn.failed" not in kinds and "error" not in kinds, kinds
        assert not [i for i in items if i["type"] == "error"], items
        assert items[-1]["type"] == "agent_message" and items[-1]["text"]
    records = rollout_records(home)
    calls = Counter(r["payload"]["name"] for r in records if r["type"] == "response_item"
                    and r["payload"].get("type") in ("function_call", "custom_tool_call"))
    print(f"codex exec over {transport}: {times} s for {len(PROMPTS)} prompts; calls {dict(calls)}")
    assert calls["exec_command"] >= 1, calls  # Codex's shell tool
    assert calls["apply_patch"] >= 1, calls  # its patch tool (freeform: a custom tool call)
    assert calls["create_goal"] + calls["get_goal"] + calls["update_goal"] >= 1, calls  # its goals
    assert sum(calls.values()) >= len(PROMPTS) * ROUNDS, calls

    # Every response Codex used is in the server's ledger under the transport asked for.
    used = {r["payload"]["response_id"] for r in records if r["type"] == "token_usage_record"}
    assert len(used) >= len(PROMPTS) * (ROUNDS + 1)
    seen = wait_for(lambda: (lambda got: got if len(got) == len(used) else None)(ledger(store, used)),
                    timeout_s=20, what="the ledger lines of Codex's responses")
    assert set(seen.values()) == {transport}, Counter(seen.values())

    assert snapshot(workdir) == before  # nothing overwritten, deleted or added
    assert egress.seen == []  # Codex reached nothing but the server
    shutil.rmtree(home / "sessions")
