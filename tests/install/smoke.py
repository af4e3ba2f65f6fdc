"""Smoke test of an installed ``responses-ws`` (a wheel in a fresh virtualenv): run it with
that environment's Python, from any directory, not from the checkout::

    /tmp/venv/bin/python tests/install/smoke.py [path/to/responses_ws-….whl]

It starts ``responses-ws serve --port <free>`` (the ``responses-ws`` next to this Python) in
a new temporary directory, waits until it is serving, checks ``GET /healthz``, ``GET /readyz`` and
``responses-ws --version``, runs one WebSocket turn (``response.create`` → ``response.completed``
with text), stops the server with SIGINT and checks it exits cleanly.  The server's wheel
holds no lab: no ``bench`` module in the wheel (when its path is given) nor importable, and
``responses-ws bench`` ends with the hint to install ``responses-ws-bench``.  Only the standard
library and ``websockets`` (a dependency of the package) are used.  ``make smoke-wheel``
builds the wheel and runs this on a given interpreter.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import websockets

START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def wait_started(proc: subprocess.Popen, log: Path) -> None:
    """Until ``responses-ws serve`` says it is serving (it does once /readyz answers 200)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"responses-ws serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        if "responses-ws serving on" in log.read_text():
            return
        time.sleep(0.5)
    raise SystemExit(f"not serving after {START_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")


async def one_turn(base: str) -> str:
    async with websockets.connect(base.replace("http", "ws", 1) + "/v1/responses") as ws:
        await ws.send(
            json.dumps(
                {"type": "response.create", "model": "emu-fast", "store": False, "input": "Say hello."}
            )
        )
        text = []
        async with asyncio.timeout(60):
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "response.output_text.delta":
                    text.append(event["delta"])
                if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                    break
    if event["type"] != "response.completed" or not text:
        raise SystemExit(f"the WebSocket turn ended with {event}")
    return "".join(text)


def check_no_lab(exe: Path, wheel: Path | None) -> None:
    """The server's wheel is the server: the lab (responses-ws-bench) is not in it."""
    if wheel is not None:
        lab = [n for n in zipfile.ZipFile(wheel).namelist() if n.split("/")[0] == "bench"]
        if lab:
            raise SystemExit(f"{wheel.name} holds the lab: {lab[:5]}")
    if importlib.util.find_spec("bench") is not None:
        raise SystemExit(f"a bench module is importable: {importlib.util.find_spec('bench').origin}")
    out = subprocess.run([exe, "bench", "--help"], check=False, capture_output=True, text=True)
    if out.returncode != 1 or "responses-ws-bench" not in out.stderr:
        raise SystemExit(f"responses-ws bench without the lab: exit {out.returncode}, {out.stderr!r}")


def main() -> int:
    exe = Path(sys.executable).parent / "responses-ws"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    check_no_lab(exe, Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="rws-smoke-") as work:
        log = Path(work) / "serve.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [exe, "serve", "--port", str(port)],
                cwd=work,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_started(proc, log)
            if get(f"{base}/healthz") != (200, {"status": "ok"}):
                raise SystemExit(f"/healthz answered {get(f'{base}/healthz')}")
            status, body = get(f"{base}/readyz")
            if status != 200 or body.get("status") != "ready":
                raise SystemExit(f"/readyz answered {status} {body}")
            text = asyncio.run(one_turn(base))
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if proc.returncode != 0:
            raise SystemExit(f"responses-ws serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        if not (Path(work) / "data").is_dir():
            raise SystemExit("the store's data directory was not created in the working directory")
    print(
        f"smoke OK: Python {platform.python_version()}, {version}, from {work}: no lab in the wheel, "
        f"/healthz, /readyz, one WebSocket turn ({len(text)} chars of text), clean stop"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
