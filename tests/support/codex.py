"""Codex CLI (``@openai/codex``, pinned in tests/clients/package.json; ``make clients``) as
the tests drive it: ``codex exec --json`` with the provider config of
tests/clients/codex/config.toml, in a checkout of its own, every connection but the
server's refused by a local proxy (:class:`Egress`).  Used by tests/integration (the
emulated model) and tests/real_model (a real one)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import string
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / "tests/clients/node_modules/.bin/codex"
CONFIG = ROOT / "tests/clients/codex/config.toml"
CATALOG = ROOT / "tests/clients/codex/models.json"


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


def write_checkout(path: Path, files: dict[str, str]) -> None:
    """``files`` (name → text) committed as a Git repository's first commit."""
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "start"]):
        subprocess.run([*git, *args], cwd=path, check=True, capture_output=True)


def snapshot(path: Path) -> dict[str, str]:
    """Every file under ``path`` but Git's own (``.git/``), with its SHA-256."""
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(path).parts
    }


def codex_home(path: Path, base_url: str, websockets: bool, catalog: Path = CATALOG) -> Path:
    home = path / "codex-home"
    home.mkdir()
    config = string.Template(CONFIG.read_text()).substitute(
        base_url=f"{base_url}/v1", websockets="true" if websockets else "false", catalog=str(catalog)
    )
    (home / "config.toml").write_text(config)
    return home


@dataclass(frozen=True)
class CodexRun:
    events: list[dict]  # its --json events
    took_s: float
    returncode: int
    stderr: str


def run_codex(
    home: Path,
    workdir: Path,
    prompt: str,
    egress: Egress,
    key: str,
    *,
    timeout_s: float = 60.0,
    model: str | None = None,
) -> CodexRun:
    """``codex exec --json`` of one prompt (with ``model`` instead of the config's).  Codex
    runs without a sandbox, so only the model's choices keep the checkout intact."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(
        CODEX_HOME=str(home),
        HOME=str(home),
        RESPONSES_WS_API_KEY=key,
        HTTPS_PROXY=egress.url,
        HTTP_PROXY=egress.url,
        ALL_PROXY=egress.url,
        NO_PROXY="127.0.0.1,localhost",
        NO_COLOR="1",
    )
    cmd = [
        str(CODEX),
        "exec",
        "--json",
        "--strict-config",
        "--sandbox",
        "danger-full-access",
        "-c",
        'approval_policy="never"',
        "-C",
        str(workdir),
        *(["-m", model] if model else []),
        prompt,
    ]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # Codex and the commands it started
        out, err = proc.communicate()
        pytest.fail(f"codex exec did not finish in {timeout_s:.0f} s; stderr:\n{err[-3000:]}")
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    return CodexRun(events, time.monotonic() - start, proc.returncode, err)


def rollout_records(home: Path) -> list[dict]:
    """What Codex recorded of its session(s) (``$CODEX_HOME/sessions/…/rollout-*.jsonl``)."""
    return [
        json.loads(line)
        for f in sorted((home / "sessions").rglob("*.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]
