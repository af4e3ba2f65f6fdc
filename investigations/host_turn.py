"""A session host's CPU per steady crowd turn, in this process, with real sockets: where it
goes, by stage.

    python -m investigations.host_turn [--loops 32] [--seconds 10] [--words 4000] [--tools 8]
                                       [--tool-ms 300] [--stages] [--gc serving|default]

This process is the host's event loop (uvloop, as a Ray actor's): the product's
:class:`~actors.host.websocket.WebSocket`, :class:`~actors.host.connection.Connection` and
:class:`~actors.host.sender.Sender` for each socket, session cores sharing one host's prompt
parts and the process's echoes, a store writer journaling ``store:false`` ledger lines into a
SQLite store (the host's default), the loop-lag watch, figures asked for by every create (as
``bench capacity`` asks).  The model is canned, no Ray, no channel: each call answers a
``shell`` tool call in the chunks an emulator replica sends (the prefill with the call's
first bytes, the rest of its arguments, the end), a few milliseconds apart.  ``--loops``
Codex-like loops (``bench capacity``'s crowd: ``--words`` of instructions and ``--tools``
tools resent with every create, ~450-token tool outputs, chained by
``previous_response_id``, each after ``--tool-ms`` × 0.5-1.4 of tool time) run in a client
subprocess over loopback TCP, so this process's CPU is the host's alone.

After every loop has finished two turns, the CPU of this process (every thread:
``time.process_time``) over ``--seconds`` of steady turns, per turn, and the kernel's part
of it (``os.times``); each generation's garbage collections over the window (``gc.callbacks``:
how many a second, their time a turn, the longest).  ``--stages`` adds the
CPU of this thread (``time.thread_time``) in each stage per turn — a client frame read and
handled (its create parsed, its prompt prepared, the call started), the model's chunks
handled, batches of frames encoded and written, and their parts — by wrapping those methods
for the run (measurement only; a stage's figure holds the stages inside it).  What no stage
holds is the event loop's own work (reading sockets, waking tasks) and the canned model.
Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

CALL = json.dumps({"command": ["bash", "-lc", "pytest -x tests/test_parser.py"]})

# (stage, the class's module, class, method): what --stages times, outermost first
STAGES = [
    ("a client frame read and handled", "actors.host.websocket", "WebSocket", "data_received"),
    ("  the session core on the create", "actors.core.session", "Session", "_on_frame"),
    ("    parse and validate", "actors.core.session", None, "parse_client_event"),
    ("    history and input (tokenised)", "actors.core.history", "History", "start"),
    ("    prompt and call built", "actors.core.turn_start", "TurnStart", "turn"),
    ("    response.created and in_progress", "actors.core.session", "Session", "_on_calls_started"),
    ("  the model call started", "actors.host.connection", "Connection", "start"),
    ("a model chunk handled (session core)", "actors.core.session", "Session", "_on_inference"),
    ("  the response finished", "actors.core.session", "Session", "_finish"),
    ("effects carried out (events queued, bills)", "actors.host.connection", "Connection", "carry_out"),
    ("a batch of frames sent", "actors.host.sender", "Sender", "_send"),
    ("  events encoded", "actors.protocol.events", "EventEncoder", "pieces"),
    ("  socket writes", "actors.host.websocket", "WebSocket", "flush"),
]

ACC: dict[str, list[float]] = {}
PAUSES: dict[int, list[float]] = {0: [], 1: [], 2: []}  # each collection's pause (s), by generation
_BEGAN = [0.0]


def _collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _BEGAN[0] = time.perf_counter()
    else:
        PAUSES[info["generation"]].append(time.perf_counter() - _BEGAN[0])


def observe(transport: str, report: dict[str, float]) -> None:
    """The host's phase histogram is Ray's, not here: the figures are only counted."""
    ACC.setdefault("_observed", [0.0, 0.0])[0] += len(report)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    tt = time.thread_time

    def timed(*args: Any, **kwargs: Any) -> Any:
        t = tt()
        try:
            return fn(*args, **kwargs)
        finally:
            entry = ACC.setdefault(name, [0.0, 0.0])
            entry[0] += 1
            entry[1] += tt() - t

    return timed


def wrap_stages() -> None:
    import importlib

    for name, module_name, cls_name, attr in STAGES:
        module = importlib.import_module(module_name)
        owner: Any = module if cls_name is None else getattr(module, cls_name)
        setattr(owner, attr, _timed(name, getattr(owner, attr)))


def client(args: argparse.Namespace) -> None:
    """The loops (the client subprocess): prints the turns finished so far, every second."""
    import websockets

    from bench.kinds import floor
    from bench.rollouts import TIMINGS_KEY

    spec = argparse.Namespace(
        tool_output_tokens=450,
        seed=1,
        model="emu-fast",
        instruction_words=args.words,
        tools=args.tools,
        turns=64,
    )
    fixed, outputs = floor.creates_for(spec)
    fixed["metadata"] = {TIMINGS_KEY: "1"}
    done = [0]

    async def loop(k: int) -> None:
        url = f"ws://127.0.0.1:{args.port}/v1/responses"
        async with websockets.connect(url, max_size=None, compression=None) as ws:
            previous, i = None, 0
            while True:
                await ws.send(floor.build_create(fixed, outputs[i % len(outputs)], previous))
                i += 1
                while '"response.completed"' not in (message := str(await ws.recv()))[:80]:
                    pass
                previous = json.loads(message)["response"]
                done[0] += 1
                await asyncio.sleep(args.tool_ms / 1000 * (0.5 + (k % 10) / 10))

    async def main() -> None:
        tasks = [asyncio.create_task(loop(k)) for k in range(args.loops)]
        while all(not t.done() for t in tasks):
            await asyncio.sleep(1)
            print(done[0], flush=True)

    asyncio.run(main())


async def serve(
    data_dir: str,
    answer: Callable[[Any], AsyncIterator[list[Any]]],
    config: Any = None,
    *,
    cache: Any = None,
    gc_pacing: bool = True,
) -> tuple[asyncio.AbstractServer, int, Any]:
    """A session host's serving parts in this process, listening on 127.0.0.1: the product's
    WebSocket, Connection, Sender and session cores (sharing one host's prompt parts, and
    ``cache``, a host's cache budget, when given), a SQLite store writer journaling the
    ``store:false`` ledger lines under ``data_dir``, the loop-lag watch; the model canned:
    ``answer`` yields each call's chunks; the watch paces garbage collection as the host's
    does unless not ``gc_pacing``.  The server, its port and the watch."""
    from websockets.server import ServerProtocol

    from actors.backend.canned import CannedClient
    from actors.backend.emulator_metadata import check_emulator_metadata
    from actors.config import SessionConfig
    from actors.core.prompt_parts import PromptParts
    from actors.core.session import Session
    from actors.host.connection import Connection
    from actors.host.loop_watch import LoopWatch
    from actors.host.sender import Sender
    from actors.host.websocket import WebSocket
    from inference import collector
    from inference.types import InferenceRequest
    from store.journal import Journal
    from store.sqlite import SQLiteStore
    from store.writer import StoreWriter

    class Model(CannedClient):
        def stream(self, request: InferenceRequest) -> Any:
            call = super().stream(request)
            self.requests.clear()  # a canned client keeps every request: not this one
            return call

    config = config or SessionConfig()
    store = SQLiteStore(data_dir)
    writer = StoreWriter(store, journal=Journal(os.path.join(data_dir, "journal"), "host"))
    model = Model(["emu-fast"], answer, check_metadata=check_emulator_metadata)
    parts: PromptParts[Any] = PromptParts()
    watch = LoopWatch(pacing=collector.BurstPacing() if gc_pacing else None)
    loop = asyncio.get_running_loop()
    senders: list[asyncio.Task[None]] = []

    async def accept(ws: WebSocket, request: Any) -> Any:
        return ws.protocol.accept(request)

    def on_open(ws: WebSocket) -> None:
        session = Session(
            config,
            ["emu-fast"],
            session_key=f"c{len(senders)}",
            clock=time.time,
            check_metadata=check_emulator_metadata,
            prompt_parts=parts,
            loop_lag=watch.worst_since,
            **({} if cache is None else {"cache": cache}),
        )
        conn = Connection(session, model, writer, observe=observe)
        ws.receive(conn.feed)
        senders.append(loop.create_task(Sender(ws, conn).run()))

    def socket() -> WebSocket:
        return WebSocket(
            ServerProtocol(max_size=None), accept, on_open, ping_interval=20.0, ping_timeout=20.0
        )

    server = await loop.create_server(socket, "127.0.0.1", 0)
    watch.start()
    return server, server.sockets[0].getsockname()[1], watch


async def host(args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    from inference import collector, tokenizer
    from inference.types import Done, FunctionCallDelta, InferenceEvent, InferenceRequest, Prefilled

    async def answer(request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        n = len(request.prompt_token_ids)
        await asyncio.sleep(0.003)
        yield [
            Prefilled(n, max(0, n - 500), 0.0, 1.0, replica="r"),
            FunctionCallDelta(0, "shell", CALL[:10], 3),
        ]
        await asyncio.sleep(0.002)
        yield [FunctionCallDelta(0, "shell", CALL[10:], 12)]
        await asyncio.sleep(0.001)
        yield [Done("tool_calls", 15, 3.0)]

    if args.stages:
        wrap_stages()
    tokenizer.encode("warm up")
    collector.freeze_startup()
    if args.gc == "serving":
        collector.serving()
    server, port, _ = await serve(data_dir, answer)
    argv = [sys.executable, "-m", "investigations.host_turn", "--client", "--port", str(port)]
    argv += ["--loops", str(args.loops), "--tool-ms", str(args.tool_ms)]
    argv += ["--words", str(args.words), "--tools", str(args.tools)]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None

    async def finished() -> int:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the client process ended")
        return int(line)

    try:
        while await finished() < 2 * args.loops:  # every loop past its first turns
            pass
        n0, cpu0, t0 = await finished(), time.process_time(), time.monotonic()
        kernel0 = os.times().system
        for pauses in PAUSES.values():
            pauses.clear()
        gc.callbacks.append(_collection)
        before = {name: entry[1] for name, entry in ACC.items()}
        n1 = n0
        while time.monotonic() - t0 < args.seconds:
            n1 = await finished()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        kernel = os.times().system - kernel0
        gc.callbacks.remove(_collection)
    finally:
        proc.kill()
        await proc.wait()
        server.close()
    turns = max(1, n1 - n0)
    out: dict[str, Any] = {
        "loops": args.loops,
        "turns": n1 - n0,
        "turns_per_s": round(turns / wall, 1),
        "host_cpu_ms_per_turn": round(cpu * 1000 / turns, 3),
        "of_it_in_the_kernel": round(kernel * 1000 / turns, 3),
        "load_average": os.getloadavg()[0],
        "gc": {
            f"gen{g}": {
                "per_s": round(len(xs) / wall, 2),
                "ms_per_turn": round(sum(xs) * 1000 / turns, 3),
                "longest_ms": round(max(xs, default=0.0) * 1000, 2),
            }
            for g, xs in PAUSES.items()
        },
    }
    if args.stages:
        out["stages_ms_per_turn"] = {
            name: round((ACC[name][1] - before.get(name, 0.0)) * 1000 / turns, 3)
            for name, *_ in STAGES
            if name in ACC
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--words", type=int, default=4000, help="of instructions, resent with every create")
    p.add_argument("--tools", type=int, default=8, help="resent with every create")
    p.add_argument("--tool-ms", type=float, default=300.0, help="a loop's tool time between turns (scaled)")
    p.add_argument("--stages", action="store_true", help="the CPU of each stage per turn too")
    p.add_argument(
        "--gc", choices=["serving", "default"], default="serving", help="the collector's thresholds"
    )
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        client(args)
        return
    import uvloop

    with tempfile.TemporaryDirectory() as data_dir:
        print(json.dumps(uvloop.run(host(args, data_dir)), indent=1))
    os._exit(0)  # the writer's thread and the store's: nothing left to flush


if __name__ == "__main__":
    main()
