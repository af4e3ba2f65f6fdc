"""What a full garbage collection costs a session host's event loop, with and without the
start-up objects frozen (``inference.collector.freeze_startup``).

    python -m investigations.gc_pause [--connections 256] [--turns 12]

Imports what a server process imports, then drives ``--connections`` session cores in this
process (the product's driver; no Ray, no sockets), Codex-like turns round-robin (4000-word
instructions, 8 tools, 300-token tool outputs, chained by ``previous_response_id``), and
prints each generation's collections (count, total and longest pause, from
``gc.callbacks``) and a forced full collection's CPU once the crowd is built — first as a
process starts, then in a fresh process that froze its start-up objects first.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

TURNS_MAX = 64  # the distinct tool outputs a connection cycles through


def build(connections: int, freeze: bool) -> tuple[list[Any], Callable[[int, int], None]]:
    """``connections`` session cores in this process (start-up objects frozen first if
    ``freeze``) and the function that runs connection ``k``'s turn ``i`` on them."""
    import ray  # a server process holds Ray's objects too
    import ray.serve  # noqa: F401

    from actors.backend.emulator_metadata import check_emulator_metadata
    from actors.config import SessionConfig
    from actors.core.inputs import ClientFrame, InferenceChunk, Rendered, Written
    from actors.core.prompt_parts import PromptParts
    from actors.core.render import render_marked
    from actors.core.session import Session
    from actors.protocol.events import EventEncoder
    from bench.kinds import floor
    from inference import collector, tokenizer
    from inference.types import Done, FunctionCallDelta, Prefilled
    from tests.support.session_driver import handled

    tokenizer.encode("warm up")
    if freeze:
        collector.freeze_startup()
    spec = argparse.Namespace(
        tool_output_tokens=300, seed=1, model="emu-fast", instruction_words=4000, tools=8, turns=TURNS_MAX
    )
    fixed, outputs = floor.creates_for(spec)
    parts: PromptParts[Any] = PromptParts()
    encode = EventEncoder()
    sessions = [
        Session(
            SessionConfig(),
            ["emu-fast"],
            session_key=f"c{i}",
            clock=time.time,
            check_metadata=check_emulator_metadata,
            prompt_parts=parts,
        )
        for i in range(connections)
    ]
    previous: list[dict[str, Any] | None] = [None] * connections
    call = json.dumps({"command": ["bash", "-lc", "pytest -x tests/test_parser.py"]})

    def turn(k: int, i: int) -> None:
        session = sessions[k]
        fx = handled(session, ClientFrame(floor.build_create(fixed, outputs[i % len(outputs)], previous[k])))
        while fx.render:
            job = fx.render.pop(0)
            fx += handled(session, Rendered(job.render_id, render_marked(job.items, job.fmt)))
        (started,) = fx.start
        events = list(fx.events)
        n = len(started.request.prompt_token_ids)
        chunks = [
            [Prefilled(n, max(0, n - 400), 0, 1, replica="r")],
            [FunctionCallDelta(0, "shell", call[:10], 3)],
        ]
        chunks += [[FunctionCallDelta(0, "shell", call[j : j + 8], 2)] for j in range(10, len(call), 8)]
        chunks.append([Done("tool_calls", 40, 3.0)])
        for chunk in chunks:
            fx = handled(session, InferenceChunk(started.turn_id, chunk))
            events += fx.events
            for line in fx.usage:
                events += handled(session, Written(line.response_id, stored=True)).events
        previous[k] = json.loads(encode(events[-1]))["response"]

    return sessions, turn


def crowd(connections: int, turns: int, freeze: bool) -> dict[str, Any]:
    _, turn = build(connections, freeze)
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    began = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append((time.perf_counter() - began[0]) * 1000)

    gc.callbacks.append(timed)
    cpu = time.process_time()
    for i in range(turns):
        for k in range(connections):
            turn(k, i)
    cpu = time.process_time() - cpu
    gc.callbacks.remove(timed)
    full = time.process_time()
    gc.collect()
    full = time.process_time() - full
    return {
        "frozen": gc.get_freeze_count(),
        "tracked": len(gc.get_objects()),
        "cpu_ms_per_turn": round(cpu * 1000 / (connections * turns), 3),
        "full_collection_cpu_ms": round(full * 1000, 1),
        "collections": {
            g: {"count": len(xs), "total_ms": round(sum(xs), 1), "longest_ms": round(max(xs, default=0.0), 1)}
            for g, xs in pauses.items()
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--one", choices=["as-started", "frozen"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(crowd(args.connections, args.turns, args.one == "frozen")))
        return
    for mode in ("as-started", "frozen"):  # each in a fresh process: a freeze cannot be undone
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "investigations.gc_pause",
                "--one",
                mode,
                "--connections",
                str(args.connections),
                "--turns",
                str(args.turns),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"{mode:>10}: {out.stdout.strip()}")


if __name__ == "__main__":
    main()
