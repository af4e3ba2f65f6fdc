"""TLS at the edge: the shipped configs/haproxy-sessions-tls.cfg, with its documented edits
(bind address and port, certificate, runtime socket; bench/multinode/edits.py), on loopback
in front of a server of the embedded Ray, its session node set through HAProxy's runtime API
as the balancer sync sets it.  Real clients reach the server through it over ``https://``
and ``wss://``, each trusting a CA the test makes (tests/support/tls.py) through its own
setting (docs/deploy.md, "TLS at the edge"): the openai SDK over HTTP and
``responses.connect()``, the Agents SDK's WebSocket session and Codex CLI in WebSocket mode.
The server's usage ledger says which transport each response came over.  A client that does
not trust the CA is refused by its own TLS; plain ``ws://`` and ``http://`` to the TLS port
are closed by HAProxy without a response and without a connection to the session node."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import websockets
from agents import Agent, function_tool, responses_websocket_session, set_tracing_disabled

from bench.multinode import balancer
from bench.multinode.edits import haproxy_config
from serve.embedded import free_port
from tests.support.codex import CODEX, Egress, codex_home, rollout_records, run_codex, write_checkout
from tests.support.server import start_app, stop_app, wait_for
from tests.support.tls import make_ca, server_certificate

set_tracing_disabled(True)  # no trace export to the hosted API

CONFIG = Path(__file__).resolve().parents[2] / "configs/haproxy-sessions-tls.cfg"
APP = "rws-tls"
ROUNDS = 3  # tool calls before the model answers: short runs, a tool loop all the same
QUICK = {"emulator.tool_rounds": "0", "emulator.text_tokens": "5"}
KEY = "sk-tls-edge"


@dataclass(frozen=True)
class Edge:
    base_url: str  # https://127.0.0.1:PORT
    port: int
    ca_file: Path
    socket: Path
    ledger: Path


def ledger(path: Path, response_ids: set[str]) -> dict[str, str]:
    """The transport the server's usage ledger recorded for each of ``response_ids``."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT response_id, transport FROM usage").fetchall()
    return {rid: transport for rid, transport in rows if rid in response_ids}


def transports(edge: Edge, response_ids: set[str]) -> set[str]:
    seen = wait_for(
        lambda: (lambda got: got if len(got) == len(response_ids) else None)(
            ledger(edge.ledger, response_ids)
        ),
        timeout_s=20,
        what="the ledger lines of the responses",
    )
    return set(seen.values())


@pytest.fixture(scope="module")
def edge(ray_cluster, tmp_path_factory) -> Iterator[Edge]:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is missing: make haproxy (Debian package)", pytrace=False)
    tmp = tmp_path_factory.mktemp("tls-edge")
    data = tmp / "data"
    url = start_app(APP, **{"store.data_dir": str(data), "inference.policy.tool_rounds": ROUNDS})
    node_port = int(url.rsplit(":", 1)[1])
    ca = make_ca()
    (tmp / "ca.pem").write_bytes(ca.pem)
    (tmp / "balancer.pem").write_bytes(server_certificate(ca, ["127.0.0.1", "localhost"]).pem_with_key)
    port = free_port()
    cfg = haproxy_config(
        CONFIG.read_text(),
        bind="127.0.0.1",
        port=port,
        certificate=str(tmp / "balancer.pem"),
        stats_socket=str(tmp / "haproxy.sock"),
    )
    (tmp / "haproxy.cfg").write_text(cfg)
    log = (tmp / "haproxy.log").open("w")
    proc = subprocess.Popen(
        [haproxy, "-db", "-f", str(tmp / "haproxy.cfg")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for(
            lambda: (tmp / "haproxy.sock").exists() or proc.poll() is not None, timeout_s=10, what="haproxy"
        )
        assert proc.poll() is None, (tmp / "haproxy.log").read_text()
        # what python -m serve.balancer_sync does for a gateway's node: fill a slot, make it ready
        for line in (
            f"set server sessions/s1 addr 127.0.0.1 port {node_port}",
            "set server sessions/s1 state ready",
        ):
            balancer.command(tmp / "haproxy.sock", line)
        wait_for(
            lambda: (
                balancer.server_states(balancer.command(tmp / "haproxy.sock", "show stat")).get("s1") == "UP"
            ),
            timeout_s=15,
            what="the session node UP on its /readyz",
        )
        yield Edge(
            f"https://127.0.0.1:{port}",
            port,
            tmp / "ca.pem",
            tmp / "haproxy.sock",
            data / "responses.sqlite3",
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        stop_app(APP)


@pytest.fixture
def trusted(edge, monkeypatch) -> Edge:
    """The test CA as every client's trust store: SSL_CERT_FILE (httpx, Python's ssl for
    websockets, Codex)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(edge.ca_file))
    return edge


def node_connections(edge: Edge) -> int:
    """Connections HAProxy has opened to the session node so far (its ``stot``)."""
    return balancer.session_counts(balancer.command(edge.socket, "show stat"))["s1"]


def test_the_openai_sdk_over_https_and_wss(trusted):
    client = openai.OpenAI(base_url=f"{trusted.base_url}/v1", api_key=KEY)
    over_http = client.responses.create(model="emu-fast", input="Hi", metadata=QUICK)
    assert over_http.status == "completed" and over_http.output_text
    ids = {over_http.id}
    with client.responses.connect() as conn:  # wss://127.0.0.1:PORT/v1/responses
        previous = None
        for text in ("Hi", "And again"):
            conn.response.create(
                model="emu-fast", input=text, store=False, previous_response_id=previous, metadata=QUICK
            )
            for event in conn:
                if event.type in ("error", "response.failed", "response.incomplete"):
                    pytest.fail(f"{event.type}: {event}")
                if event.type == "response.completed":
                    previous = event.response.id
                    break
            ids.add(previous)
    assert transports(trusted, {over_http.id}) == {"http"}
    assert transports(trusted, ids - {over_http.id}) == {"websocket"}


def test_the_agents_sdk_runs_a_tool_loop_over_wss(trusted):
    reads: list[str] = []

    @function_tool
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        reads.append(path)
        return "print('hello')"

    agent = Agent(name="coder", instructions="Fix the bug.", model="emu-fast", tools=[read_file])

    async def main():
        async with responses_websocket_session(api_key=KEY, base_url=f"{trusted.base_url}/v1") as ws:
            return await ws.run(agent, "Find the bug in main.py", max_turns=10)

    result = asyncio.run(main())
    assert len(reads) == ROUNDS and isinstance(result.final_output, str) and result.final_output
    ids = {r.response_id for r in result.raw_responses if r.response_id}
    assert len(ids) == ROUNDS + 1 and transports(trusted, ids) == {"websocket"}


def test_codex_cli_in_websocket_mode_over_wss(trusted, tmp_path):
    if not CODEX.exists():
        pytest.fail(f"{CODEX} is missing: run `make clients`", pytrace=False)
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    write_checkout(workdir, {"README.md": "# demo\n", "src/main.py": "print('hello')\n"})
    home = codex_home(tmp_path, trusted.base_url, websockets=True)
    egress = Egress()
    try:
        run = run_codex(home, workdir, "List the files here and read the README.", egress, key=KEY)
    finally:
        egress.close()
    assert run.returncode == 0, f"codex exited {run.returncode}; stderr:\n{run.stderr[-3000:]}"
    kinds = [e["type"] for e in run.events]
    assert kinds[-1] == "turn.completed" and "error" not in kinds and "turn.failed" not in kinds, kinds
    assert egress.seen == []  # nothing but the balancer
    used = {r["payload"]["response_id"] for r in rollout_records(home) if r["type"] == "token_usage_record"}
    assert len(used) >= ROUNDS + 1 and transports(trusted, used) == {"websocket"}
    print(f"codex exec over wss through the TLS balancer: {run.took_s:.1f} s, {len(used)} responses")


def test_a_client_without_the_ca_is_refused_by_its_own_tls(edge, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    client = openai.OpenAI(base_url=f"{edge.base_url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.APIConnectionError) as info:
        client.responses.create(model="emu-fast", input="Hi", metadata=QUICK)
    assert "CERTIFICATE_VERIFY_FAILED" in repr(info.value.__cause__) or "certificate" in str(
        info.value.__cause__
    )


def test_plain_ws_and_http_to_the_tls_port_are_closed_without_reaching_a_node(edge):
    before = node_connections(edge)

    async def plain_ws() -> BaseException:
        try:
            async with websockets.connect(f"ws://127.0.0.1:{edge.port}/v1/responses", open_timeout=10):
                pass
        except (websockets.exceptions.WebSocketException, EOFError, OSError) as exc:  # what the client sees
            return exc
        raise AssertionError("a plain ws:// connection to the TLS port opened")

    start = time.monotonic()
    refused = asyncio.run(plain_ws())
    took = time.monotonic() - start
    assert isinstance(
        refused,
        websockets.exceptions.InvalidMessage
        | websockets.exceptions.ConnectionClosed
        | EOFError
        | ConnectionError,
    ), repr(refused)
    assert took < 10, f"the refusal took {took:.1f} s (an open timeout, not a close)"
    print(f"plain ws:// to the TLS port: {refused!r} after {took:.2f} s")
    with pytest.raises(httpx.RemoteProtocolError):  # closed with no response: not a hang, not a 4xx
        httpx.get(f"http://127.0.0.1:{edge.port}/v1/models", timeout=10)
    assert node_connections(edge) == before, "HAProxy opened a connection to the node for a plaintext client"
