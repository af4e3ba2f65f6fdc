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
every session ran ``turns_after`` more turns.  The sessions run on the load runner (its
``resume`` workload, stepped: ``Resume(steps=True)``), each turn's replica asked of the store
in the client process (:class:`ReplicaOf`, ``Resume.inspect``); so does the pressure (its
``chains`` over ``http-full``, :class:`Pressure`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from store.state_reader import serving_replica

from ..runner import Chains, LoadResult, LoadRun, LoadSpec, Resume, start_local
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
RUN_LIMIT_S = 3600.0  # the load's deadline: the experiment ends it long before


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
    """``n`` loops of stateless requests through the balancer, one after another, each with
    ``tokens`` hidden reasoning tokens, while on: a load run of its own each time it is
    started (the runner's chains over ``http-full``: a ``POST`` a turn), ended by
    :meth:`stop` (the requests in flight complete)."""

    def __init__(self, url: str, n: int, tokens: int) -> None:
        chains = Chains(
            think_s=0.0, reconnect_s=0.5, text_tokens=(1, 1), reasoning_tokens=tokens, model=MODEL
        )
        self.spec = LoadSpec(
            targets=(url,),
            loops=n,
            transport="http-full",
            workload="chains",
            chains=chains,
            warmup_s=0.0,
            duration_s=RUN_LIMIT_S,
        )
        self.load: LoadRun | None = None
        self.runs: list[LoadResult] = []

    def start(self) -> None:
        self.load = start_local(self.spec)

    def stop(self) -> None:
        if self.load is not None:
            self.runs.append(self.load.stop())
            self.load = None

    @property
    def sent(self) -> int:
        """Requests completed."""
        return sum(r.ok for run in self.runs for r in run.records)

    @property
    def errors(self) -> list[str]:
        """The failed requests' errors, and the loops'."""
        failed = [r.error_code or "error" for run in self.runs for r in run.records if not r.ok]
        return failed + [e for run in self.runs for es in run.errors.values() for e in es]


@dataclass(frozen=True)
class ReplicaOf:
    """The inference replica that served a session's response, read from the cluster store
    (the lane's latest response and its replica, unsealed with the session's token): the
    runner asks it after every turn (``Resume.inspect``, in its client process; picklable)."""

    redis_url: str
    timeout_s: float = 10.0

    def __call__(self, token: str, response_id: str) -> str:
        store = _redis(self.redis_url)
        deadline = time.monotonic() + self.timeout_s
        while (replica := serving_replica(store, token, KEY_PREFIX, response_id)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{response_id} not in the store")
            time.sleep(0.05)
        return replica


@functools.cache  # one client a process
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def first_input(plan: Plan) -> str:
    """A session's first input (``{loop}``: its index): its own task, past the 1024 tokens
    from which ``cached_tokens`` is reported, after the shared instructions when on."""
    shared = INSTRUCTIONS if plan.shared_instructions else ""
    words = (plan.prefix_tokens - len(shared) // 5) // 5  # a word of it is ~5 tokens
    return shared + "session {loop} opens its task: " + "read the file and report " * words


def load_spec(h: Harness, plan: Plan) -> LoadSpec:
    """The sessions as the runner runs them: the resume workload stepped by the experiment
    (``Resume.steps``), each session opened through the balancer, each turn's replica read
    from the store (:class:`ReplicaOf`), each connection's node from the balancer."""
    resume = Resume(
        first_input=first_input(plan),
        next_input="session {loop} step {turn}: go on",
        text_tokens=plan.text_tokens,
        model=MODEL,
        header=HEADER,
        compression="deflate",
        seeded=True,
        steps=True,
        inspect=ReplicaOf(h.redis_url),
    )
    return LoadSpec(
        targets=(h.ws_url,),
        loops=plan.sessions,
        workload="resume",
        resume=resume,
        locate=h.connection_lookup,
        warmup_s=0.0,
        duration_s=RUN_LIMIT_S,
        open_timeout_s=60.0,
    )


@dataclass
class Session:
    """One client's conversation as the runner recorded it: a ``store:false`` chain whose
    turns carry the replica that served them and their usage, and the node of each."""

    turns: list[Turn] = field(default_factory=list)
    nodes: list[str | None] = field(default_factory=list)


def sessions(result: LoadResult, plan: Plan, node_at: dict[str, str]) -> list[Session]:
    """Each session's completed turns, in order, with the node its connection went to (the
    node whose URL it was opened at, ``node_at``; else, through the balancer, its answer)."""
    conns = {(c.loop, c.index): c for c in result.connections}
    out = [Session() for _ in range(plan.sessions)]
    for r in sorted(result.records, key=lambda r: r.sent):
        if not r.ok or r.note is None:
            continue
        c = conns.get((r.loop, r.connection if r.connection is not None else -1))
        out[r.loop].turns.append(Turn(r.note, r.input_tokens or 0, r.cached_tokens or 0, r.done))
        out[r.loop].nodes.append(None if c is None else node_at.get(c.target) or c.server)
    return out


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


def settle(h: Harness, plan: Plan, n: int) -> list[dict[str, str]]:
    t = plan.settle_timeout_s
    return h.driver("settle", DEPLOYMENT, str(n), "--timeout", str(t), timeout_s=t + 60)


@dataclass
class Span:
    """One change of the replica set while the sessions turned: each session's completed turns
    when it began and when it ended, and what the deployment did."""

    name: str
    placement: list[dict[str, str]]
    after: list[dict[str, str]]
    start: dict[int, int]
    end: dict[int, int]
    seconds_to_settle: float


def change(
    h: Harness,
    plan: Plan,
    load: LoadRun,
    name: str,
    toggle: Callable[[], None],
    placement: list[dict[str, str]],
    target: int,
) -> Span:
    """Sessions turning while ``toggle`` changes the load, until the replica set is ``target``
    replicas and every session still well ran ``turns_after`` turns on it."""
    start = {k: n for k, (n, _) in load.progress().items()}
    load.go(plan.think_s)
    t0 = time.monotonic()
    toggle()
    try:
        after = settle(h, plan, target)
        settled = time.monotonic()
        mark = load.progress()
        deadline = settled + plan.settle_timeout_s
        while time.monotonic() < deadline and any(
            n - mark[k][0] < plan.turns_after for k, (n, failed) in load.progress().items() if not failed
        ):
            time.sleep(0.2)
    finally:
        load.halt()
    end = {k: n for k, (n, _) in load.progress().items()}
    return Span(name, placement, after, start, end, round(settled - t0, 1))


def changed(span: Span, turns: list[Session]) -> Change:
    """A :class:`Change` from the sessions' turns across ``span``."""
    before = {str(i): s.turns[span.start[i] - 1].replica for i, s in enumerate(turns)}
    seen = {str(i): [t.replica for t in s.turns[span.start[i] : span.end[i]]] for i, s in enumerate(turns)}
    return Change(
        span.name,
        span.placement,
        span.after,
        moves(before, seen, ids(span.placement), ids(span.after)),
        span.seconds_to_settle,
        sum(span.end[i] - span.start[i] for i in range(len(turns))),
    )


def steps_failed(load: LoadRun, step: str) -> RuntimeError:
    failed = sorted(k for k, (_, bad) in load.progress().items() if bad)
    return RuntimeError(f"sessions {failed} failed in the {step}: see the load's errors")


def run(h: Harness, plan: Plan) -> dict[str, Any]:
    """The experiment's phases (the module's docstring), its sessions on the load runner."""
    pressure = Pressure(h.url, plan.pressure, plan.pressure_tokens)
    names = [n.name for n in h.session_nodes]
    node_url = {n: h.node_url(n).replace("http", "ws", 1) + "/v1/responses" for n in names}
    # Each session resumes on the other session node: a new host, no pin in its router.
    others: dict[str | None, str] = {n: node_url[next(o for o in names if o != n)] for n in names}
    others[None] = node_url[names[0]]
    deployed = settle(h, plan, plan.min_replicas)
    try:
        pressure.start()
        full = settle(h, plan, plan.max_replicas)
        with start_local(load_spec(h, plan)) as load:  # the sessions open through the balancer
            if load.turns(RESUMED_TURN) < plan.sessions:  # the pins
                raise steps_failed(load, "first turns")
            if load.resume(others) < plan.sessions:
                raise steps_failed(load, "resume on the other node")
            down = change(h, plan, load, "scale-down", pressure.stop, full, plan.min_replicas)
            up = change(h, plan, load, "scale-up", pressure.start, down.after, plan.max_replicas)
            pressure.stop()
            result = load.stop()
    finally:
        pressure.stop()  # also when a step failed: its client process ends
    ss = sessions(result, plan, {u: n for n, u in node_url.items()})
    if any(len(s.turns) <= RESUMED_TURN for s in ss):  # a session's early turn missing its record
        raise RuntimeError(f"sessions without their first turns: {result.errors}")
    pins = {str(i): s.turns[RESUMED_TURN - 1].replica for i, s in enumerate(ss)}
    pinned = pins_per_replica(pins, ids(full))
    resumed = [(s.turns[RESUMED_TURN - 1], s.turns[RESUMED_TURN]) for s in ss]
    changes = [changed(down, ss), changed(up, ss)]

    checks = {str(i): check_cached(s.turns) for i, s in enumerate(ss)}
    flat = [c for cs in checks.values() for c in cs]
    kept = [c.share for c in flat if c.kind == "kept" and c.share is not None]
    resumed_checks = [cs[RESUMED_TURN] for cs in checks.values()]
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
        "changes": [_change(c) for c in changes],
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
            str(i): {"turns": [asdict(t) for t in s.turns], "nodes": s.nodes} for i, s in enumerate(ss)
        },
        "errors": [e for k in sorted(result.errors) for e in result.errors[k]],
        "pressure": {"requests": pressure.sent, "errors": pressure.errors[:5]},
    }


async def experiment(h: Harness, plan: Plan) -> dict[str, Any]:
    """:func:`run` off the event loop (the runner's calls block)."""
    return await asyncio.to_thread(run, h, plan)


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
