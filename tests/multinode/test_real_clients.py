"""Real clients through a drain: Codex CLI (``codex exec --json``, WebSocket mode) and the
openai SDK (``client.responses.connect()`` with its opt-in reconnection) run their tasks
through HAProxy on one session node while Ray drains it (``ray drain-node``, a deadline, the
kill at the deadline).  Each client's connections pass a recording relay
(tests/support/wiretap.py), which shows what it saw: the close code, the new connection and
its node, what the client sent first there (Codex: the whole history, no
``previous_response_id``; the SDK: the stored chain's next turn), the time until it was
served again and that response's ``cached_tokens``.  The tier's last module: it starts the
node killed before and drains it again."""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import websockets
from openai import OpenAI
from openai.types.websocket_reconnection import ReconnectingEvent

from bench.multinode import Harness
from bench.multinode.balancer import command
from bench.multinode.load import error_code
from tests.multinode.conftest import CODEX_TOOL_ROUNDS, wait_up
from tests.support.codex import CODEX, CodexRun, Egress, codex_home, run_codex, write_checkout
from tests.support.waiting import TimedOut, wait_until
from tests.support.wiretap import Tapped, Wiretap

CODEX_SESSIONS = int(os.environ.get("RWS_MULTINODE_CODEX_SESSIONS", "2"))
SDK_CLIENTS = int(os.environ.get("RWS_MULTINODE_SDK_CLIENTS", "2"))
DEADLINE_S = 25
SDK_ANSWER_TOKENS = 24  # the scripted answer's length: under max_output_tokens (the default, 48, is not)
SDK_TURNS_AFTER = 3  # turns each SDK client completes on its new node before it stops
CHECKOUT = {
    "README.md": "# demo\n\nA checkout Codex works in during the test.\n",
    "src/main.py": "print('hello')\n",
    "src/utils/io.py": "def helper():\n    return 1\n",
    "tests/test_parser.py": "def test_parser():\n    assert True\n",
}
PREFIX = " ".join(["the quick brown fox jumps over a lazy dog"] * 150)  # > 1024 tokens: cacheable


@dataclass
class SdkRun:
    """What one SDK client did and saw."""

    index: int
    turns: list[tuple[float, str, int]] = field(default_factory=list)  # (completed at, id, cached_tokens)
    reconnects: list[tuple[float, int, int]] = field(default_factory=list)  # (at, close code, attempt)
    send_failures: int = 0  # a create whose send raised (the socket closed under it)
    resent: int = 0  # creates sent again on a new connection (no terminal event on the old one)
    shutting_down: int = 0
    errors: list[str] = field(default_factory=list)


def sdk_chain(base_url: str, run: SdkRun, stop: threading.Event) -> None:
    """A ``store:true`` chain over ``responses.connect()`` with reconnection on: each turn
    continues the previous response; a create that got no terminal event (the socket closed, or
    ``server_shutting_down``) is sent again, first thing, on the SDK's new connection."""
    client = OpenAI(base_url=f"{base_url}/v1", api_key=f"sk-sdk-{run.index}", max_retries=0)
    pending: dict = {}
    queued = threading.Event()
    holder: dict = {}

    def on_reconnecting(event: ReconnectingEvent) -> None:
        run.reconnects.append((time.monotonic(), event.close_code, event.attempt))
        if pending and not queued.is_set():
            holder["conn"].response.create(**pending)  # queued by the SDK, flushed once reconnected
            queued.set()
            run.resent += 1

    previous: str | None = None
    with client.responses.connect(on_reconnecting=on_reconnecting) as conn:
        holder["conn"] = conn
        while not stop.is_set():
            text = f"sdk client {run.index} turn {len(run.turns)}"
            first = [{"role": "developer", "content": f"Chain {run.index}. {PREFIX}"}]
            pending.clear()
            pending.update(
                model="emu-fast",
                input=[*([] if previous else first), {"role": "user", "content": text}],
                store=True,
                prompt_cache_key=f"sdk-{run.index}",
                max_output_tokens=40,
                metadata={"emulator.text_tokens": str(SDK_ANSWER_TOKENS)},  # a whole answer, not cut
                **({"previous_response_id": previous} if previous else {}),
            )
            queued.clear()
            try:
                conn.response.create(**pending)
            except websockets.ConnectionClosed:
                run.send_failures += 1  # the SDK reconnects on its next read, which sends it again
            for event in conn:
                if event.type == "response.completed":
                    details = event.response.usage.input_tokens_details if event.response.usage else None
                    run.turns.append(
                        (time.monotonic(), event.response.id, details.cached_tokens if details else 0)
                    )
                    previous = event.response.id
                    break
                if event.type == "error" and error_code(event.model_dump()) == "server_shutting_down":
                    run.shutting_down += 1  # the server's 1012 follows; the SDK reconnects
                    queued.clear()
                    continue
                if event.type in ("error", "response.failed", "response.incomplete"):
                    run.errors.append(f"{event.type}: {event.model_dump_json()[:300]}")
                    return
            pending.clear()
            time.sleep(0.3)  # the client's think time between turns: the load it puts on the server


def first_served(conns: list[Tapped], after: float) -> tuple[Tapped, float, dict] | None:
    """The first connection opened after ``after`` that completed a response: it, when, the
    response."""
    for c in conns:
        if c.opened_at >= after and (done := c.events("response.completed")):
            return c, done[0][0], done[0][1]["response"]
    return None


def open_at(conns: list[Tapped], node: str, t: float) -> Tapped | None:
    """The client's connection to ``node`` that was open at ``t``."""
    return next((c for c in conns if c.server == node and c.opened_at <= t and (c.closed_at or t) >= t), None)


def cached(response: dict) -> int:
    return int(((response.get("usage") or {}).get("input_tokens_details") or {}).get("cached_tokens") or 0)


def test_codex_cli_and_the_openai_sdk_pass_through_a_drain(harness: Harness, tmp_path: Path):
    assert CODEX.exists(), f"{CODEX} is missing: run `make clients`"
    node, other = harness.session_nodes[-1].name, harness.session_nodes[0].name
    for name in (node, other):
        if harness.ready(name) != 200:  # killed by a test before
            t0 = time.monotonic()
            harness.restart(name)
            print(f"\nrestarted {name}: ready in {time.monotonic() - t0:.1f}s")
    wait_up(harness)
    balancer, port = harness.topology.bridge_address, harness.balancer_settings.port
    # Every client's first connection on ``node``: the balancer sends no new one to ``other``.
    command(harness.stats_socket, f"set server sessions/{other} state drain")
    egress = Egress()
    codex_taps = [Wiretap(balancer, port, harness.connection_servers) for _ in range(CODEX_SESSIONS)]
    sdk_taps = [Wiretap(balancer, port, harness.connection_servers) for _ in range(SDK_CLIENTS)]
    codex_runs: dict[int, CodexRun | BaseException] = {}
    codex_ended: dict[int, float] = {}
    sdk_runs = [SdkRun(i) for i in range(SDK_CLIENTS)]
    stop = threading.Event()

    def codex(i: int) -> None:
        work = tmp_path / f"codex{i}"
        (work / "checkout").mkdir(parents=True)
        write_checkout(work / "checkout", CHECKOUT)
        home = codex_home(work, codex_taps[i].url, websockets=True)
        try:
            codex_runs[i] = run_codex(
                home,
                work / "checkout",
                "List the files here and read the README.",
                egress,
                key=f"sk-codex-{i}",
                timeout_s=240,
            )
        except BaseException as exc:  # noqa: BLE001 - pytest.fail in a thread: reported below
            codex_runs[i] = exc
        codex_ended[i] = time.monotonic()

    def sdk(i: int) -> None:
        try:
            sdk_chain(sdk_taps[i].url, sdk_runs[i], stop)
        except Exception as exc:  # noqa: BLE001 - reported and judged below
            sdk_runs[i].errors.append(f"{type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=codex, args=(i,), daemon=True) for i in range(CODEX_SESSIONS)]
    threads += [threading.Thread(target=sdk, args=(i,), daemon=True) for i in range(SDK_CLIENTS)]
    t_start = time.monotonic()
    try:
        for t in threads:
            t.start()

        # Drain once every client is on ``node`` and has completed a response there.
        def connections() -> str:
            return "the clients' connections (node, responses completed, close code): " + repr(
                [
                    [(c.server, len(c.events("response.completed")), c.close_code) for c in tap.connections]
                    for tap in codex_taps + sdk_taps
                ]
            )

        def all_served_on_node() -> bool:
            if all(
                any(c.server == node and c.events("response.completed") for c in tap.connections)
                for tap in codex_taps + sdk_taps
            ):
                return True
            assert not codex_runs, (
                f"a Codex session ended before the drain ({sorted(codex_runs)}); {connections()}"
                f"; SDK errors {[r.errors for r in sdk_runs]}"
            )
            return False

        try:
            wait_until(all_served_on_node, 90, f"every client served on {node}", every_s=0.2)
        except TimedOut as exc:
            raise AssertionError(f"{exc}; {connections()}") from None
        command(harness.stats_socket, f"set server sessions/{other} state ready")
        wait_until(  # the balancer may send the clients' next connections to ``other`` again
            lambda: harness.server_states()[other].startswith("UP"),
            10,
            f"{other} UP in the balancer",
        )
        asked = time.monotonic()
        drain = harness.drain(node, deadline_s=DEADLINE_S, reason_message="multinode real clients")
        for t in threads[:CODEX_SESSIONS]:
            t.join(timeout=240)
        with contextlib.suppress(TimedOut):  # what is missing is judged below, client by client
            wait_until(
                lambda: all(
                    sum(w > asked for w, _, _ in r.turns) >= SDK_TURNS_AFTER or r.errors for r in sdk_runs
                ),
                60,
                f"{SDK_TURNS_AFTER} SDK turns after the drain",
                every_s=0.2,
            )
    finally:
        stop.set()
        command(harness.stats_socket, f"set server sessions/{other} state ready")
        for t in threads[CODEX_SESSIONS:]:
            t.join(timeout=30)
        for tap in codex_taps + sdk_taps:
            tap.close()
        egress.close()

    rel = lambda w: f"{w - asked:.2f}s" if w is not None else "never"  # noqa: E731
    print(
        f"\ndrained {node} at {asked - t_start:.1f}s after the clients started (deadline {DEADLINE_S}s, "
        f"`ray drain-node` returned at {rel(drain.requested_at)}); times from the drain command"
    )
    problems = []
    for i, tap in enumerate(codex_taps):
        run = codex_runs.get(i)
        ws = [c for c in tap.connections if c.upgraded]
        http = [c.request for c in tap.connections if not c.upgraded]
        hit = open_at(ws, node, asked)
        after = first_served(ws, hit.closed_at) if hit is not None and hit.closed_at is not None else None
        kinds = [e["type"] for e in run.events] if isinstance(run, CodexRun) else []
        items = (
            [e["item"] for e in run.events if e["type"] == "item.completed"]
            if isinstance(run, CodexRun)
            else []
        )
        errors = (
            [e for e in run.events if e["type"] in ("error", "turn.failed")]
            if isinstance(run, CodexRun)
            else []
        )
        error_items = [x for x in items if x.get("type") == "error"]
        calls = sum(x.get("type") == "command_execution" for x in items)
        resend = after[0].creates()[0][1] if after else {}
        last_before = hit.creates()[-1][1] if hit is not None and hit.creates() else {}
        print(
            f"  codex {i}: {'exit ' + str(run.returncode) if isinstance(run, CodexRun) else run!r}, "
            f"{rel(codex_ended.get(i))} end, {calls} shell calls, last event {kinds[-1:]}; connections "
            f"{[(c.server, c.close_code, len(c.creates())) for c in ws]}; other requests {http}\n"
            f"    on {node}: {len(hit.creates()) if hit else 0} creates, "
            f"{len(hit.events('error')) if hit else 0} error events "
            f"{[error_code(e) for _, e in hit.events('error')] if hit else []}, closed "
            f"{hit.close_code if hit else None} at {rel(hit.closed_at if hit else None)}, ended by "
            f"{hit.ended_by if hit else None} (the client's close frame: {hit.client_close_code if hit else None})\n"
            f"    next: {after[0].server if after else None}, its first create: previous_response_id "
            f"{resend.get('previous_response_id')!r}, {len(resend.get('input') or [])} input items "
            f"(the last create on {node}: {len(last_before.get('input') or [])} items, previous_response_id "
            f"{'set' if last_before.get('previous_response_id') else 'none'}); served "
            f"{after[1] - hit.closed_at if after and hit and hit.closed_at else float('nan'):.2f}s after the close, "
            f"cached_tokens {cached(after[2]) if after else None}; Codex's error events {errors[:3]}, "
            f"error items {error_items[:3]}"
        )
        if not isinstance(run, CodexRun):
            problems.append(f"codex {i}: {run!r}")
            continue
        if run.returncode != 0 or kinds[-1:] != ["turn.completed"] or "turn.failed" in kinds:
            problems.append(f"codex {i}: exit {run.returncode}, {kinds[-3:]}: {run.stderr[-1500:]}")
        if items[-1:] and (items[-1]["type"] != "agent_message" or not items[-1]["text"]):
            problems.append(f"codex {i}: its last item {items[-1]}")
        # Codex leaves on the ``server_shutting_down`` it got (it opens a new connection for the
        # create and drops this one itself), or on the server's 1012 after its last response.
        told = [t for t, e in (hit.events("error") if hit else []) if error_code(e) == "server_shutting_down"]
        if (
            hit is None
            or hit.closed_at is None
            or hit.closed_at > drain.deadline_at
            or not (
                hit.close_code == 1012 or (hit.ended_by == "client" and told and told[0] <= hit.closed_at)
            )
        ):
            problems.append(
                f"codex {i}: its connection on {node}: "
                f"{hit and (hit.close_code, hit.ended_by, rel(hit.closed_at), [rel(t) for t in told])}"
            )
        if (
            after is None
            or after[0].server != other
            or cached(after[2]) <= 0
            or "previous_response_id" in resend
        ):
            problems.append(
                f"codex {i}: not served again as expected: {after and (after[0].server, cached(after[2]))}"
            )
        if any(r.startswith("POST") for r in http):
            problems.append(f"codex {i}: HTTP fallback {http}")
    for r, tap in zip(sdk_runs, sdk_taps, strict=True):
        ws = [c for c in tap.connections if c.upgraded]
        hit = open_at(ws, node, asked)
        after = first_served(ws, hit.closed_at) if hit is not None and hit.closed_at is not None else None
        resend = after[0].creates()[0][1] if after else {}
        before = [
            rid
            for w, rid, _ in r.turns
            if hit is not None and hit.closed_at is not None and w < hit.closed_at
        ]
        print(
            f"  sdk {r.index}: {len(r.turns)} turns ({sum(w > asked for w, _, _ in r.turns)} after the drain "
            f"command), connections {[(c.server, c.close_code, len(c.creates())) for c in ws]}; reconnects "
            f"(at, close code, attempt) {[(rel(a), code, n) for a, code, n in r.reconnects]}; "
            f"{r.shutting_down} server_shutting_down, {r.send_failures} failed sends, {r.resent} resent; errors "
            f"{r.errors}\n"
            f"    on {node}: closed {hit.close_code if hit else None} at {rel(hit.closed_at if hit else None)}; "
            f"next {after[0].server if after else None}: first create continues "
            f"{'the chain' if before and resend.get('previous_response_id') == before[-1] else repr(resend.get('previous_response_id'))}, "
            f"served {after[1] - hit.closed_at if after and hit and hit.closed_at else float('nan'):.2f}s after the "
            f"close, cached_tokens {cached(after[2]) if after else None} (steady state: median "
            f"{statistics.median([c for _, _, c in r.turns[1:]] or [0])})"
        )
        if r.errors:
            problems.append(f"sdk {r.index}: {r.errors}")
        if hit is None or hit.close_code != 1012 or not any(code == 1012 for _, code, _ in r.reconnects):
            problems.append(f"sdk {r.index}: no 1012 on {node}: {hit and hit.close_code} {r.reconnects}")
        if after is None or after[0].server != other or cached(after[2]) <= 0:
            problems.append(
                f"sdk {r.index}: not served again as expected: {after and (after[0].server, cached(after[2]))}"
            )
        elif not before or resend.get("previous_response_id") != before[-1]:
            problems.append(
                f"sdk {r.index}: the chain did not continue: {resend.get('previous_response_id')}"
            )
        if sum(w > asked for w, _, _ in r.turns) < SDK_TURNS_AFTER:
            problems.append(f"sdk {r.index}: {len(r.turns)} turns")
    print(f"  balancer: {harness.server_states()}; tool rounds per Codex task {CODEX_TOOL_ROUNDS}")
    assert problems == [], "\n".join(problems)
