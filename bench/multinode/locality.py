"""Prefix locality across inference replicas, on real nodes (docs/scaling.md, "Prefix locality
across inference replicas"): how the sessions' pins spread over several replicas on two
accelerator nodes, whether a client resumed on another session node finds its prefix, and
which sessions lose their replica when Serve's autoscaling adds or removes replicas under
load, with ``cached_tokens`` checked on every turn (:mod:`.locality_figures`).

The harness (:data:`SPECS`): the head carrying ``accelerator: 2`` (it saves a raylet on a
small machine), an accelerator node with ``accelerator: 2`` and two session nodes; the
inference deployment autoscales between ``min_replicas`` and ``max_replicas`` with
``target_ongoing_requests: 1``.  A WebSocket connection's calls after its first go over the
direct channel to its replica, which Serve's autoscaling does not see; the replica count is
driven by ``pressure`` stateless HTTP requests (long hidden reasoning, little CPU) that go
through Serve: with them the deployment scales to ``max_replicas``, without them back to
``min_replicas``.  Each session's serving replica is read from the cluster store after every
turn (the lane's latest response and its replica, unsealed with the session's token).

Phases: scale up to ``max_replicas`` (no sessions yet); open the sessions through the
balancer, two turns each (the pins); each session drops its socket and resumes on the other
session node (a new host, whose router has no pin: the conversation's replica comes with
its state), one turn; the pressure stops while the sessions keep turning (scale-down), then
starts again (scale-up); each change is over once ``settle`` sees the new replica set and
every session ran ``turns_after`` more turns.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from store.state_reader import serving_replica

from ..client import TERMINAL_EVENT_TYPES, ResponsesSocket, connect
from ..stats import spread
from .cleanup import LOCALITY_PREFIX
from .harness import Harness
from .locality_figures import Moves, Turn, check_cached, imbalance, moves, pins_per_replica
from .topology import NodeSpec

SPECS = (
    NodeSpec("head", {"head": 1, "accelerator": 2}),
    NodeSpec("accelerator", {"accelerator": 2}),
    NodeSpec("session", {"session": 1}),
    NodeSpec("session", {"session": 1}),
)
DEPLOYMENT = "responses-ws/InferenceDeployment"
KEY_PREFIX = "rws:"  # configs/serve-cluster.yaml
HEADER = "x-responses-ws-resume-token"
MODEL = "emu-fast"
GRACE_S = 60.0
SUBNET = "10.213.41.0/24"  # its own names and network (LOCALITY_PREFIX): not the tier's harness
INSTRUCTIONS = "You are a careful coding agent working in a repository. " * 40  # ~440 tokens
RESUMED_TURN = 2  # two turns through the balancer, then the resume on the other node


@dataclass(frozen=True)
class Plan:
    sessions: int = 16
    min_replicas: int = 2
    max_replicas: int = 4
    pressure: int = 4  # stateless requests in flight while the deployment should be at its max
    pressure_tokens: int = 4000  # hidden reasoning tokens of each (≈ 4 s at emu-fast's pace)
    prefix_tokens: int = 1200  # each session's first input: past the 1024 tokens cached_tokens needs
    # Each session's prompt is its own from the first token (conversations of their own, as a
    # Codex-like client's with its own prompt_cache_key); on: the first inputs start with the
    # same ~440 tokens of instructions, as one agent app's do (one prefix route; under the 1024
    # tokens from which a hit is reported, so a replica that never served a session reports 0).
    shared_instructions: bool = False
    text_tokens: int = 16
    think_s: float = 1.0  # between a session's turns
    turns_after: int = 2  # turns each session runs after the replica set settled
    settle_timeout_s: float = 240.0


def app_args(plan: Plan) -> Callable[[dict[str, Any]], None]:
    def edit(args: dict[str, Any]) -> None:
        args.setdefault("session", {})["resume_grace_s"] = GRACE_S
        scaling = args.setdefault("inference", {}).setdefault("scaling", {})
        scaling["autoscaling"] = dict(
            scaling.get("autoscaling") or {},
            min_replicas=plan.min_replicas,
            max_replicas=plan.max_replicas,
            target_sequences=None,  # Serve's own policy on the first calls it routes (the plan's driver)
            target_ongoing_requests=1,
            upscale_delay_s=0.0,
            downscale_delay_s=5.0,
        )

    return edit


def harness(plan: Plan, **kwargs: Any) -> Harness:
    return Harness(SPECS, prefix=LOCALITY_PREFIX, subnet=SUBNET, edit_args=app_args(plan), **kwargs)


class Pressure:
    """``n`` threads, each sending one stateless request after another through the balancer
    while on (:meth:`start`, :meth:`stop`; a request in flight at the stop finishes)."""

    def __init__(self, url: str, n: int, tokens: int) -> None:
        self.url, self.n, self.tokens = url + "/v1/responses", n, tokens
        self._on = threading.Event()
        self._threads: list[threading.Thread] = []
        self.sent = 0
        self.errors: list[str] = []

    def start(self) -> None:
        self._on.set()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.n)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._on.clear()

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=120)

    def _run(self) -> None:
        body = {
            "model": MODEL,
            "store": False,
            "input": "pressure",
            "metadata": {
                "emulator.reasoning_tokens": str(self.tokens),
                "emulator.text_tokens": "1",
                "emulator.tool_rounds": "0",
            },
        }
        data = json.dumps(body).encode()
        while self._on.is_set():
            req = urllib.request.Request(self.url, data, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    r.read()
                self.sent += 1
            except OSError as exc:
                self.errors.append(repr(exc)[:200])
                time.sleep(0.5)


@dataclass
class Session:
    """One client's conversation: a ``store:false`` chain whose turns record the replica that
    served them (from the store) and their usage."""

    index: int
    plan: Plan
    store: redis.Redis
    turns: list[Turn] = field(default_factory=list)
    nodes: list[str | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sock: ResponsesSocket | None = None
    token: str = ""
    previous: str | None = None

    @property
    def ws(self) -> ResponsesSocket:
        """The session's open socket."""
        assert self.sock is not None, f"session {self.index} is not open"
        return self.sock

    def create(self) -> dict[str, Any]:
        i = len(self.turns)
        shared = INSTRUCTIONS if self.plan.shared_instructions else ""
        task = f"session {self.index} opens its task: "
        words = (self.plan.prefix_tokens - len(shared) // 5) // 5  # a word of it is ~5 tokens
        text = (
            shared + task + "read the file and report " * words
            if i == 0
            else f"session {self.index} step {i}: go on"
        )
        out: dict[str, Any] = {
            "type": "response.create",
            "model": MODEL,
            "store": False,
            "input": text,
            "metadata": {
                "emulator.tool_rounds": "0",
                "emulator.text_tokens": str(self.plan.text_tokens),
                "emulator.seed": str(self.index),
            },
        }
        if self.previous is not None:
            out["previous_response_id"] = self.previous
        return out

    async def open(self, url: str, token: str | None = None) -> None:
        headers = {HEADER: token} if token else {}
        self.sock = await connect(url, additional_headers=headers, open_timeout=60, compression="deflate")
        self.token = token or self.sock.upgrade_headers[HEADER]

    async def turn(self, node: str | None = None) -> Turn:
        await self.ws.send(self.create())
        while True:
            event = await self.ws.recv()
            kind = event.get("type")
            if kind == "error" or (kind in TERMINAL_EVENT_TYPES and kind != "response.completed"):
                raise RuntimeError(f"session {self.index}: {json.dumps(event)[:300]}")
            if kind == "response.completed":
                break
        response = event["response"]
        replica = await self._replica(response["id"])
        usage = response["usage"]
        t = Turn(
            replica,
            int(usage["input_tokens"]),
            int(usage["input_tokens_details"]["cached_tokens"]),
            time.monotonic(),
        )
        self.turns.append(t)
        self.nodes.append(node)
        self.previous = response["id"]
        return t

    async def _replica(self, response_id: str, timeout_s: float = 10.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            replica = await asyncio.to_thread(
                serving_replica, self.store, self.token, KEY_PREFIX, response_id
            )
            if replica is not None:
                return replica
            if time.monotonic() > deadline:
                raise TimeoutError(f"session {self.index}: {response_id} not in the store")
            await asyncio.sleep(0.05)

    async def resume(self, url: str, node: str | None) -> Turn:
        """Drop the socket (a TCP abort: the state stays resumable) and resume at ``url``."""
        self.ws.abort()
        await asyncio.sleep(0.05)
        await self.open(url, self.token)
        return await self.turn(node)

    async def loop(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self.turn(self.nodes[-1] if self.nodes else None)
                await asyncio.sleep(self.plan.think_s)
        except Exception as exc:  # noqa: BLE001 - counted; the other sessions go on
            self.errors.append(repr(exc)[:300])


@dataclass
class Change:
    """One change of the replica set under load, as the sessions saw it."""

    name: str
    replicas_before: list[dict[str, str]]
    replicas_after: list[dict[str, str]]
    moves: Moves
    seconds_to_settle: float
    turns_during: int


def ids(placement: list[dict[str, str]]) -> list[str]:
    return sorted(p["replica"] for p in placement)


async def settle(h: Harness, plan: Plan, n: int) -> list[dict[str, str]]:
    t = plan.settle_timeout_s
    return await asyncio.to_thread(
        h.driver, "settle", DEPLOYMENT, str(n), "--timeout", str(t), timeout_s=t + 60
    )


async def change(
    h: Harness,
    plan: Plan,
    sessions: list[Session],
    name: str,
    toggle: Callable[[], None],
    placement: list[dict[str, str]],
    target: int,
) -> Change:
    """Sessions turning while ``toggle`` changes the load, until the replica set is ``target``
    replicas and every session ran ``turns_after`` turns on it."""
    before = {str(s.index): s.turns[-1].replica for s in sessions}
    start = {s.index: len(s.turns) for s in sessions}
    stop = asyncio.Event()
    loops = [asyncio.create_task(s.loop(stop)) for s in sessions]
    t0 = time.monotonic()
    toggle()
    try:
        after = await settle(h, plan, target)
        settled = time.monotonic()
        mark = {s.index: len(s.turns) for s in sessions}
        while any(len(s.turns) - mark[s.index] < plan.turns_after for s in sessions if not s.errors):
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.gather(*loops)
    seen = {str(s.index): [t.replica for t in s.turns[start[s.index] :]] for s in sessions}
    return Change(
        name,
        placement,
        after,
        moves(before, seen, ids(placement), ids(after)),
        round(settled - t0, 1),
        sum(len(s.turns) - start[s.index] for s in sessions),
    )


def node_of(h: Harness, port: int, timeout_s: float = 5.0) -> str | None:
    deadline = time.monotonic() + timeout_s
    while (node := h.connection_servers().get(port)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return node


async def experiment(h: Harness, plan: Plan) -> dict[str, Any]:
    store = redis.Redis.from_url(h.redis_url, decode_responses=True)
    pressure = Pressure(h.url, plan.pressure, plan.pressure_tokens)
    deployed = await settle(h, plan, plan.min_replicas)
    pressure.start()
    full = await settle(h, plan, plan.max_replicas)
    sessions = [Session(i, plan, store) for i in range(plan.sessions)]
    await asyncio.gather(*(s.open(h.ws_url) for s in sessions))
    where = [await asyncio.to_thread(node_of, h, s.ws.local_address[1]) for s in sessions]
    for _ in range(2):
        await asyncio.gather(*(s.turn(node) for s, node in zip(sessions, where, strict=True)))
    pins = {str(s.index): s.turns[-1].replica for s in sessions}
    pinned = pins_per_replica(pins, ids(full))

    # Each session resumes on the other session node: a new host, no pin in its router.
    names = [n.name for n in h.session_nodes]
    others = [next(n for n in names if n != node) if node in names else names[0] for node in where]
    await asyncio.gather(
        *(
            s.resume(h.node_url(o).replace("http", "ws", 1) + "/v1/responses", o)
            for s, o in zip(sessions, others, strict=True)
        )
    )
    resumed = [(s.turns[-2], s.turns[-1]) for s in sessions]

    down = await change(h, plan, sessions, "scale-down", pressure.stop, full, plan.min_replicas)
    up = await change(h, plan, sessions, "scale-up", pressure.start, down.replicas_after, plan.max_replicas)
    pressure.stop()
    await asyncio.to_thread(pressure.join)
    for s in sessions:
        await s.ws.close()

    checks = {str(s.index): check_cached(s.turns) for s in sessions}
    flat = [c for cs in checks.values() for c in cs]
    kept = [c.share for c in flat if c.kind == "kept" and c.share is not None]
    resumed_checks = [checks[str(s.index)][RESUMED_TURN] for s in sessions]
    return {
        "plan": asdict(plan),
        "nodes": {n.name: n.address for n in h.topology.nodes},
        "replicas": {"deployed": deployed, "full": full},
        "pins": {
            "per_replica": pinned,
            "per_node": _per_node(pinned, full),
            "imbalance": round(imbalance(pinned), 3),
            "ideal": plan.sessions / plan.max_replicas,
        },
        "resumed_on_other_node": {
            "sessions": len(resumed),
            "same_replica": sum(a.replica == b.replica for a, b in resumed),
            "cached_share": _shares([c.share for c in resumed_checks]),
            "found_whole_prefix": sum(c.kind == "kept" and c.ok for c in resumed_checks),
        },
        "changes": [_change(c) for c in (down, up)],
        "cached_tokens": {
            "turns": len(flat),
            "by_kind": {k: sum(c.kind == k for c in flat) for k in ("first", "kept", "moved", "returned")},
            "wrong": [
                {"session": s, "turn": i, **asdict(c)}
                for s, cs in checks.items()
                for i, c in enumerate(cs)
                if not c.ok
            ],
            "kept_share": _shares(kept),
            "moved_turns_cached": [c.cached for c in flat if c.kind == "moved"],
        },
        "sessions": {
            str(s.index): {"turns": [asdict(t) for t in s.turns], "nodes": s.nodes} for s in sessions
        },
        "errors": [e for s in sessions for e in s.errors],
        "pressure": {"requests": pressure.sent, "errors": pressure.errors[:5]},
    }


def _shares(values: Sequence[float | None]) -> dict[str, Any]:
    return spread(values, ("n", "median", "min", "max"))


def _per_node(pinned: dict[str, int], placement: list[dict[str, str]]) -> dict[str, int]:
    node = {p["replica"]: p["node"] for p in placement}
    out: dict[str, int] = {}
    for replica, n in pinned.items():
        out[node[replica]] = out.get(node[replica], 0) + n
    return out


def _change(c: Change) -> dict[str, Any]:
    m = c.moves
    return {
        "name": c.name,
        "replicas_before": c.replicas_before,
        "replicas_after": c.replicas_after,
        "sessions": m.sessions,
        "moved": sorted(m.moved, key=int),
        "forced": sorted(m.forced, key=int),
        "unforced": sorted(m.unforced, key=int),
        "moved_share": round(m.moved_share, 3),
        "forced_share": round(m.forced_share, 3),
        "minimum_share": round(m.minimum, 3),
        "seconds_to_settle": c.seconds_to_settle,
        "turns_during": c.turns_during,
    }


def report(result: dict[str, Any]) -> str:
    """The figures, as the bench prints them."""
    pins, res, ct = result["pins"], result["resumed_on_other_node"], result["cached_tokens"]
    lines = [
        f"pins over {len(pins['per_replica'])} replicas: {sorted(pins['per_replica'].values(), reverse=True)} "
        f"(per node {pins['per_node']}; fullest/mean {pins['imbalance']})",
        f"resumed on the other session node: {res['same_replica']}/{res['sessions']} on the same replica, "
        f"{res['found_whole_prefix']}/{res['sessions']} found their whole prefix; cached share {res['cached_share']}",
    ]
    for c in result["changes"]:
        lines.append(
            f"{c['name']} {len(c['replicas_before'])}→{len(c['replicas_after'])} replicas "
            f"(settled in {c['seconds_to_settle']} s, {c['turns_during']} turns): moved "
            f"{len(c['moved'])}/{c['sessions']} = {c['moved_share']} (forced {c['forced_share']}, "
            f"minimum k/n {c['minimum_share']}, unforced {len(c['unforced'])})"
        )
    lines.append(
        f"cached_tokens on {ct['turns']} turns {ct['by_kind']}: wrong {len(ct['wrong'])}; kept-turn share "
        f"{ct['kept_share']}; moved turns' cached {sorted(set(ct['moved_turns_cached']))}; "
        f"errors {result['errors'][:3]}"
    )
    return "\n".join(lines)
