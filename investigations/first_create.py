"""A crowd's first creates on one session host, in this process: the host's CPU per first
create, by phase.

    python -m investigations.first_create [--connections 256] [--rounds 5] [--out results/first_create.json]

``--connections`` sessions share one host's prompt parts (as a session host's WebSocket
sessions do); each gets the first create of a ``crowd`` loop of ``bench capacity`` (~30 KB:
4000-word instructions and 8 tools every loop sends alike, and the loop's own task), through
the product's driver (no Ray, no sockets, no model: the model's chunks are a tool call's,
made here).  Per round, a fresh host (its prompt parts) and fresh connections (each its own
event encoder, as a connection's sender has); the JSON the process keeps of the echoed
instructions and tools (``actors.protocol.echoes``) lives as long as the process, as on a
host.  Reported per first create, in CPU ms of this thread: ``handle`` (the frame parsed,
validated, prepared and the call built: the session's part before the call starts),
``encode`` (each event of the response as its connection's encoder writes it: the
``response.created`` and ``in_progress`` and the terminal event echo the instructions and
tools), ``chunks`` (the model's output handled, the response finished); the median and the
least over the rounds after the first (which pays the one-time renderings).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


def first_creates(connections: int) -> list[str]:
    from bench import workload as wl
    from bench.conversation import TIMINGS_KEY
    from bench.runner.loop import Encoder, workload

    w = workload("crowd", 0, None)
    enc = Encoder.build(w, "ws", True, "first_create")
    out = []
    for i in range(connections):
        task = json.dumps({"role": "user", "content": [{"type": "input_text", "text": wl.task(w, i)}]})
        meta = wl.metadata(replace(w, resume_tokens=0), i)
        out.append(enc.body(task, json.dumps({**meta, TIMINGS_KEY: "1"})))
    return out


def one_round(frames: list[str]) -> dict[str, float]:
    from actors.backend.emulator_metadata import check_emulator_metadata
    from actors.config import SessionConfig
    from actors.core.inputs import ClientFrame, InferenceChunk, Written
    from actors.core.prompt_parts import PromptParts
    from actors.core.session import Session
    from actors.protocol import EventEncoder
    from inference.types import Done, FunctionCallDelta, Prefilled
    from tests.support.session_driver import handled

    call = json.dumps({"command": ["bash", "-lc", "pytest -x tests/test_parser.py"]})
    parts: PromptParts[Any] = PromptParts()
    spent = {"handle": 0.0, "encode": 0.0, "chunks": 0.0}
    clock = time.thread_time
    for i, frame in enumerate(frames):
        session = Session(
            SessionConfig(),
            ["emu-fast"],
            session_key=f"c{i}",
            clock=time.time,
            check_metadata=check_emulator_metadata,
            prompt_parts=parts,
        )
        encoder = EventEncoder()
        t0 = clock()
        fx = handled(session, ClientFrame(frame))
        t1 = clock()
        (started,) = fx.start
        written = [encoder(e).encode() for e in fx.events]
        t2 = clock()
        n = len(started.request.prompt_token_ids)
        chunks = [[Prefilled(n, 0, 0, 1, replica="r")], [FunctionCallDelta(0, "shell", call, 20)]]
        chunks.append([Done("tool_calls", 20, 3.0)])
        later = []
        for chunk in chunks:
            got = handled(session, InferenceChunk(started.turn_id, chunk))
            later += got.events
            for line in got.usage:
                later += handled(session, Written(line.response_id, stored=True)).events
        t3 = clock()
        written += [encoder(e).encode() for e in later]
        t4 = clock()
        spent["handle"] += t1 - t0
        spent["encode"] += (t2 - t1) + (t4 - t3)
        spent["chunks"] += t3 - t2
    return {phase: s * 1000 / len(frames) for phase, s in spent.items()}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("results/first_create.json"))


def run(args: argparse.Namespace) -> int:
    from bench import results

    frames = first_creates(args.connections)
    rounds = [one_round(frames) for _ in range(max(2, args.rounds))]
    later = rounds[1:]
    figures = {
        phase: {
            "median": round(statistics.median(r[phase] for r in later), 3),
            "least": round(min(r[phase] for r in later), 3),
        }
        for phase in ("handle", "encode", "chunks")
    }
    total = [sum(r.values()) for r in later]
    figures["total"] = {"median": round(statistics.median(total), 3), "least": round(min(total), 3)}
    for phase, f in figures.items():
        print(f"{phase:>7}: {f['median']:.3f} ms per first create (least {f['least']:.3f})")
    payload = {"connections": args.connections, "rounds": rounds, "ms_per_first_create": figures}
    print(f"wrote {results.write(args.out, payload, args.run)}")
    return 0


if __name__ == "__main__":
    from investigations import main

    raise SystemExit(main("investigations.first_create"))
