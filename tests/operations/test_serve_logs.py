"""``responses-ws serve`` shows warnings from inside the app in its own terminal: here a
session host's warning when the (overloaded) inference backend refuses a response, as
text by default and as JSON lines with ``--log-format json``.  The servers run in child
processes of their own (their own Ray), started from a directory outside the checkout
with a config of one sequence per inference replica (tests/support/server.py): the
``operator_server`` (text) and ``json_logs_server`` fixtures of tests/conftest.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import websockets

from bench.client import ws_url
from tests.support.serve_process import ServeProcess
from tests.support.server import busy_profiles

WARNING_TEXT = "inference failed for resp_"


async def overload(url: str) -> str:
    """A long response holds the only slot; a second one on another lane is refused."""
    async with websockets.connect(ws_url(url)) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "emu-fast",
                    "store": False,
                    "stream_id": "long",
                    "input": "x",
                    "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "3000"},
                }
            )
        )
        while json.loads(await ws.recv())["type"] != "response.output_text.delta":
            pass
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "emu-fast",
                    "store": False,
                    "stream_id": "other",
                    "input": "y",
                }
            )
        )
        while True:
            event = json.loads(await ws.recv())
            if event.get("stream_id") == "other" and event["type"] in (
                "response.failed",
                "response.completed",
            ):
                return event["type"]


def warning_reaches_the_terminal(server: ServeProcess) -> str:
    """Overload it, wait for the session host's warning in its output, stop it (Ctrl-C);
    the warning's line."""
    assert asyncio.run(overload(server.url)) == "response.failed"
    line = server.wait_for_line(WARNING_TEXT)
    assert server.stop() == 0
    out = server.output()
    assert "responses-ws serving on" in out and "shutting down" in out
    assert "INFO" not in out.split("responses-ws serving on")[1]  # the default level: warnings and errors
    assert (server.cwd / "data" / "responses.sqlite3").is_file()  # the store lives in the working directory
    return line


def test_a_session_host_warning_reaches_the_serve_terminal_as_text(operator_server: ServeProcess):
    line = warning_reaches_the_terminal(operator_server)
    assert "WARNING" in line and "model_calls.py" in line and "actor_name=rws-" in line


def test_a_session_host_warning_reaches_the_serve_terminal_as_json(json_logs_server: ServeProcess):
    entry = json.loads(warning_reaches_the_terminal(json_logs_server))
    assert entry["levelname"] == "WARNING" and entry["message"].startswith(WARNING_TEXT)
    assert entry["actor_name"].startswith("rws-")  # a session host (Ray adds the actor's name)


def test_the_app_config_logs_section_reaches_the_session_hosts(ray_cluster, tmp_path):
    """As a Serve config file's ``args.logs`` does: the app config's ``logs`` (JSON) is what
    the gateway applies to its session hosts, whose warning lands in their worker log as a
    JSON line (this Ray has no job LoggingConfig, and Serve no logging_config)."""
    from serve.embedded import deploy, local_config
    from tests.support.server import stop_app

    url = deploy(
        local_config(
            **{"inference.profiles": busy_profiles(), "session.warm_actors": 1, "logs.encoding": "JSON"}
        ),
        name="rws-json-logs",
    )
    try:
        assert asyncio.run(overload(url)) == "response.failed"
        logs_dir = Path(ray_cluster._private.worker._global_node.get_logs_dir_path())
        deadline = time.monotonic() + 30
        found = []
        while not found and time.monotonic() < deadline:
            for path in logs_dir.glob("worker-*.err"):
                found += [
                    line
                    for line in path.read_text(errors="replace").splitlines()
                    if WARNING_TEXT in line and line.startswith("{")
                ]
            time.sleep(0.5)
        assert found, "no JSON warning in the workers' logs"
        entry = json.loads(found[-1])
        assert entry["levelname"] == "WARNING" and entry["name"] == "actors.host.model_calls"
    finally:
        stop_app("rws-json-logs")
