"""The lab's one runner and one client: the kinds that apply load (concurrent agent loops or
streams, turn after turn) run it on bench/runner, and every other module that opens
WebSocket-mode connections itself (through bench/client.py, tests/test_layout.py) is listed
here with the reason of :data:`REASONS` it may, and what it measures instead of a load's turns."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"

# The kinds that apply load: their loops run on the load runner (directly, or through the
# capacity kind's level or the ledger kind's clients), none opens a socket for them.
LOAD_KINDS = {
    "bench/kinds/admission.py",
    "bench/kinds/capacity.py",
    "bench/kinds/drain.py",
    "bench/kinds/ledger.py",
    "bench/kinds/ledger_nodes.py",
    "bench/kinds/neighbours.py",
    "bench/kinds/resume.py",
    "bench/kinds/scaling.py",
    "bench/kinds/soak.py",
    "bench/kinds/streams.py",
    "bench/multinode/load.py",
    "bench/multinode/locality.py",
    "bench/multinode/scaling.py",
}
ON_THE_RUNNER = ("bench.runner", "bench.kinds.capacity.one_level", "bench.kinds.ledger.Clients")
# The rule: a module opens connections of its own only to measure what a load's records
# (bench/runner's TurnRecord: a turn's times, its tokens, how it ended, its response and usage;
# ConnectionRecord: a connection's node, its creates and answers, its close code) cannot hold.
# Each reason is checked where the code can show it
# (:func:`test_each_reason_holds_where_the_code_can_show_it`).
REASONS = {
    "probe": "one socket's turns, one at a time: a probe's latency or cost beside (or without) a load",
    "connections": "connections themselves: opened, held or resumed, their cost or handshake, few or no turns",
    "client": "the lab's own clients: the runner's channel, the replay's transports, the reference",
}
# Modules that open connections themselves: (their reason, what they measure).
OWN_CONNECTIONS = {
    "bench/kinds/scaling.py": (
        "connections",
        "idle connections opened one at a time (how fast the gateways take them), memory and CPU each",
    ),
    "bench/kinds/floor.py": (
        "probe",
        "one socket's per-turn cost against a reference server, sequential turns",
    ),
    "bench/kinds/floor_hotpath.py": ("probe", "one socket's per-turn overhead with an instant model"),
    "bench/kinds/memory.py": ("probe", "one connection's memory as its cache grows"),
    "bench/kinds/neighbours.py": (
        "probe",
        "a probe turn on an open socket beside the runner's loads (HTTP clients, a burst of resumed "
        "first turns); the stored responses the burst continues written before, one at a time",
    ),
    "bench/kinds/fidelity.py": ("probe", "one conversation on a real engine and on its emulated twin"),
    "bench/transports.py": (
        "client",
        "one conversation's turns one at a time per transport: floor length's, the replay's",
    ),
    "bench/runner/channels.py": ("client", "the runner's own channel"),
    "bench/reference.py": (
        "client",
        "one turn of each kind recorded from the server, the reference's answers",
    ),
}
# The modules that run many clients of their own at once (a load, off the runner), and what the
# runner does not do that they need: each is to move to bench/runner; a module new here moves instead.
LOADS_OFF_THE_RUNNER: dict[str, str] = {}


WORDS = (
    "client",
    "runner",
    "transports",
    "rollouts",
    "websockets",
    "capacity",
    "statistics",
    "stats",
)  # worth parsing


@functools.cache  # each module parsed once for every test
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def imported(path: Path) -> set[str]:
    """``module.name`` of every ``from X import name`` (relative ``X`` resolved) and every
    ``import X`` in the module (none looked for in a module that names none of :data:`WORDS`)."""
    if not any(w in path.read_text() for w in WORDS):
        return set()
    tree = parsed(path)
    package = ".".join(path.relative_to(BENCH.parent).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(x for x in (base, node.module or "") if x)
            out |= {f"{mod}.{a.name}" for a in node.names} | {mod}
    return out


@functools.cache  # parsed once for both tests
def lab_modules() -> dict[str, set[str]]:
    paths = (p for p in sorted(BENCH.rglob("*.py")) if "build" not in p.relative_to(BENCH).parts)
    return {str(p.relative_to(BENCH.parent)): imported(p) for p in paths}


def test_the_kinds_that_apply_load_run_it_on_the_load_runner():
    mods = lab_modules()
    for path in LOAD_KINDS:
        names = mods[path]
        assert any(n.startswith(ON_THE_RUNNER) for n in names), f"{path} applies load without bench/runner"
        own = {"bench.transports", "bench.rollouts", "websockets"} & names
        assert not own, f"{path} applies load with a client of its own: {own}"


REPEATED = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.For, ast.AsyncFor, ast.While)


def called(call: ast.AST) -> str | None:
    """The name a call calls (``f(…)``, ``x.f(…)``), None for anything else."""
    if not isinstance(call, ast.Call):
        return None
    return getattr(call.func, "id", None) or getattr(call.func, "attr", None)


def opens_sockets_by_the_many(tree: ast.Module) -> bool:
    """The module calls ``connect`` inside a comprehension (how N sockets are opened at once)."""
    comps = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
    return any(
        called(call) == "connect"
        for comp in ast.walk(tree)
        if isinstance(comp, comps)
        for call in ast.walk(comp)
    )


def runs_clients_by_the_many(tree: ast.Module) -> set[str]:
    """The functions of the module that open sockets (they call ``connect``) or send a turn on
    one (coroutines that call ``create``) which it starts many at once: called in a
    comprehension or a loop and not awaited there (a task, a gather's member), where
    ``await f()`` and ``asyncio.run(f())`` run one after another."""
    openers = {
        f.name
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(called(c) == "connect" for c in ast.walk(f))
    } | {
        f.name
        for f in ast.walk(tree)
        if isinstance(f, ast.AsyncFunctionDef) and any(called(c) == "create" for c in ast.walk(f))
    }
    one_by_one = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Await)}
    one_by_one |= {id(n.args[0]) for n in ast.walk(tree) if called(n) == "run" and getattr(n, "args", None)}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, REPEATED):
            body = node.body if isinstance(node, ast.For | ast.AsyncFor | ast.While) else [node]
            out |= {
                name
                for part in body
                for c in ast.walk(part)
                if (name := called(c)) in openers and id(c) not in one_by_one
            }
    return out


def module(path: str) -> ast.Module:
    return parsed(BENCH.parent / path)


def test_the_checks_see_sockets_and_clients_opened_by_the_many():
    many_sockets = ast.parse(
        "async def f(n):\n    return await asyncio.gather(*(connect(u) for _ in range(n)))"
    )
    many_clients = ast.parse(
        "async def client(u):\n    async with connect(u) as s: ...\n"
        "async def main(n):\n    await asyncio.gather(*[client(u) for _ in range(n)])"
    )
    one_by_one = ast.parse(
        "async def client(u):\n    async with connect(u) as s: ...\n"
        "def main(n):\n    for _ in range(n):\n        asyncio.run(client(u))\n"
        "async def amain(n):\n    for _ in range(n):\n        await client(u)"
    )
    many_turns = ast.parse(
        "async def turn(s):\n    return await s.create(input='go')\n"
        "async def main(socks):\n    await asyncio.gather(*(turn(s) for s in socks))\n"
        "async def probe(s, n):\n    for _ in range(n):\n        await turn(s)"
    )
    assert opens_sockets_by_the_many(many_sockets) and not opens_sockets_by_the_many(many_clients)
    assert (
        runs_clients_by_the_many(many_clients) == {"client"} and runs_clients_by_the_many(one_by_one) == set()
    )
    assert runs_clients_by_the_many(many_turns) == {"turn"}
    assert (
        runs_clients_by_the_many(
            ast.parse(ast.unparse(many_turns.body[0]) + "\n" + ast.unparse(many_turns.body[2]))
        )
        == set()
    )


def test_each_reason_holds_where_the_code_can_show_it():
    """A probe opens its sockets one at a time and runs no clients at once; a module that runs
    many clients of its own at once is a load and says what keeps it off the runner; a lab
    client is used by another lab module."""
    mods = lab_modules()
    loads = {path for path in OWN_CONNECTIONS if runs_clients_by_the_many(module(path))}
    assert loads == set(LOADS_OFF_THE_RUNNER), (
        f"run these loads on bench/runner: {sorted(loads - set(LOADS_OFF_THE_RUNNER))}; "
        f"listed as loads but running none: {sorted(set(LOADS_OFF_THE_RUNNER) - loads)}"
    )
    for path, (reason, _) in OWN_CONNECTIONS.items():
        tree = module(path)
        if reason == "probe":
            assert not opens_sockets_by_the_many(tree) and path not in loads, f"{path}: a load, not a probe"
        if reason == "client":
            name = path.removesuffix(".py").replace("/", ".")
            users = [p for p, names in mods.items() if p != path and any(n.startswith(name) for n in names)]
            assert users, f"{path}: a client no other lab module uses"


def test_every_module_that_opens_connections_itself_says_what_it_measures_instead():
    assert {reason for reason, _ in OWN_CONNECTIONS.values()} <= set(REASONS)
    opens = {path for path, names in lab_modules().items() if "bench.client.connect" in names}
    assert opens == set(OWN_CONNECTIONS), (
        "open connections for a load through bench/runner; a module that measures something else "
        f"is listed in OWN_CONNECTIONS: unlisted {sorted(opens - set(OWN_CONNECTIONS))}, "
        f"listed but opening none {sorted(set(OWN_CONNECTIONS) - opens)}"
    )


# A function whose name says it summarises a sample (a median, a mean, a spread, quantiles).
SUMMARY_WORDS = ("median", "mean", "spread", "quantile", "percentile", "pct", "stdev")


def test_the_lab_computes_its_statistics_with_the_one_stats_module():
    """No lab module but bench/stats.py imports ``statistics``, and a function named for a
    summary figure outside it takes its figures from bench/stats.py (it names them, the one
    module computes them): two medians with different answers cannot come back."""
    mods = lab_modules()
    own = sorted(path for path, names in mods.items() if path != "bench/stats.py" and "statistics" in names)
    assert not own, (
        f"import bench.stats (pct, median, mean, spread, pstdev, line) instead of statistics: {own}"
    )
    for path in mods:
        if path == "bench/stats.py":
            continue
        tree = parsed(BENCH.parent / path)
        named = [
            n.name
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and any(w in n.name for w in SUMMARY_WORDS)
        ]
        if named:
            assert any(n.startswith("bench.stats") for n in mods[path]), (
                f"{path} defines {named} without bench/stats.py: compute the figures there"
            )


# What each kind measures, one quantity a kind: kinds measuring the same quantity are one kind
# with variants (``bench floor [hotpath|length]``, ``bench ledger [nodes]``); each row says, in
# one line, what keeps the kind apart from the others.
QUANTITIES = {
    "agentloop": "where an agent rollout's time goes (tool, prefill, decode, API) per transport, side by side",
    "floor": "a turn's time outside the model on one socket: against a reference, instant model, growing",
    "memory": "a connection's memory per cached token and its plateau at the cap (bytes, not time)",
    "streams": "the delivery rate of many concurrent streams (tok/s a stream, not a turn's overhead)",
    "neighbours": "a probe turn's slowdown beside other load on the same host (a ratio to idle)",
    "capacity": "a node's turns/s, latency and CPU by role under N loops (the load runner)",
    "scaling": "turns/s and per-node CPU against the number of session nodes (the load runner)",
    "soak": "stream invariants and memory over a long run of checked loops (the load runner)",
    "admission": "connects at scale: bursts, ramps, refusals, memory and CPU per held connection",
    "ledger": "the usage ledger reconciled with the clients across kills: hosts, or whole nodes",
    "resume": "a reconnect's time to the next turn's first event, against a steady turn",
    "drain": "sockets mid-turn across a redeploy: nothing reset, lost or unanswered",
    "fuzz": "hostile frames and requests: every answer judged",
    "fidelity": "the emulated twin's cached tokens and timing against a real engine",
}


def test_each_kind_measures_one_quantity_of_its_own():
    from bench import KINDS

    assert set(QUANTITIES) == set(KINDS), "say what a new kind measures (or make it a variant of one)"


# The modules besides bench/client.py that use the ``websockets`` library itself, and why: none
# is a client of the server's WebSocket mode through the lab's one client.
OWN_WEBSOCKETS = {
    "bench/fuzz_oracle.py": "hostile frames: raw bytes and invalid UTF-8 over a synchronous socket, on purpose",
    "bench/report/browser.py": "Chromium's DevTools protocol (the report's browser check), not the server",
    "bench/floor_reference.py": "the floor kind's minimal reference server (a server, not a client)",
    "bench/reference.py": "the bare-protocol reference server (a server, not a client)",
}


def test_the_lab_has_one_websocket_client():
    """Only bench/client.py imports ``websockets`` to talk to the server; a kind catches the
    client's errors as bench/client.py names them (``ConnectionClosed``, ``close_code``, the
    upgrade's refusals) and reads what it needs through its socket's methods."""
    users = {
        path
        for path, names in lab_modules().items()
        if any(n == "websockets" or n.startswith("websockets.") for n in names)
    }
    assert users - {"bench/client.py"} == set(OWN_WEBSOCKETS), (
        "catch the client's errors from bench/client.py instead of importing websockets: "
        f"{sorted(users - {'bench/client.py'} - set(OWN_WEBSOCKETS))}; listed but not using it: "
        f"{sorted(set(OWN_WEBSOCKETS) - users)}"
    )
