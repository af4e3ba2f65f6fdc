"""A bare-protocol reference server: WebSocket mode at its cheapest, in a process of its own.

One process, the ``websockets`` library (no compression, as the lab's clients connect), no
model, no store, no history.  It parses every ``response.create`` (``json.loads``) and
answers it at once, model time zero, with frames encoded ahead:

- **recorded** (``--frames FILE``, ``-`` for standard input; :func:`record`): the very
  frames a server answered a first turn, a steady turn and a rollout's last turn with,
  recorded from it (the response, item and call ids and the ``previous_response_id``
  templated, the timings in ``metadata["responses_ws.timings"]`` zeroed, the host's
  ``loop_lag`` left out) — ``bench capacity``'s reference beside this server, the same
  crowd in the same run;
- **synthesized** (no ``--frames``; :class:`Frames`): a Response echoing the connection's
  first create's model, instructions and tools, a function call of one arguments delta, or a
  short text message — the client's own capacity (``bench capacity --reference-only``).

Which answer (:func:`choose`): the create's tool results in context (its chain's
``function_call_output`` items so far) against its ``metadata["emulator.tool_rounds"]``,
as the emulated model decides: fewer, a tool call (the first turn's frames without a
``previous_response_id``, a steady turn's with one); as many, the rollout's last answer.

    with ReferenceServer(recorded=answers) as url:   # a child process on a free loopback port
        ...                                           # url: http://127.0.0.1:PORT

    python -m bench.reference [--host 127.0.0.1] [--port 0] [--rounds 8] [--frames FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TIMINGS = json.dumps({"queue": 0.0, "prefill": 0.0, "decode": 0.0, "api_overhead": 0.0})
TIMINGS_KEY = "responses_ws.timings"  # where a Response carries the server's timings
READY_PREFIX = "reference server on "
START_TIMEOUT_S = 30.0
ID = "@@rid@@"  # the response id's place in a template (survives JSON encoding)


class Frames:
    """The encoded answers of one connection, the response id left open."""

    def __init__(self, create: dict[str, Any]) -> None:
        base = {
            "id": ID,
            "object": "response",
            "created_at": int(time.time()),
            "model": create.get("model", "emu-fast"),
            "instructions": create.get("instructions"),
            "tools": create.get("tools", []),
            "store": bool(create.get("store", False)),
            "metadata": {},
        }
        call = {"type": "function_call", "id": "fc_" + ID, "call_id": "call_" + ID, "name": "shell"}
        args = '{"command":["bash","-lc","make test"]}'
        done_call = {**call, "arguments": args, "status": "completed"}
        message = {
            "type": "message",
            "id": "msg_" + ID,
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Done: the tests pass.", "annotations": []}],
        }
        usage = {"input_tokens": 0, "output_tokens": 20, "total_tokens": 20}
        meta = {"responses_ws.timings": TIMINGS}

        def event(kind: str, **body: Any) -> list[str]:
            return json.dumps({"type": kind, **body}, separators=(",", ":")).split(ID)

        running = {**base, "status": "in_progress", "output": []}
        opening = [
            event("response.created", sequence_number=0, response=running),
            event("response.in_progress", sequence_number=1, response=running),
        ]
        self.tool = opening + [
            event(
                "response.output_item.added",
                sequence_number=2,
                output_index=0,
                item={**call, "arguments": ""},
            ),
            event(
                "response.function_call_arguments.delta",
                sequence_number=3,
                item_id="fc_" + ID,
                output_index=0,
                delta=args,
            ),
            event(
                "response.function_call_arguments.done",
                sequence_number=4,
                item_id="fc_" + ID,
                output_index=0,
                arguments=args,
            ),
            event("response.output_item.done", sequence_number=5, output_index=0, item=done_call),
            event(
                "response.completed",
                sequence_number=6,
                response={
                    **base,
                    "status": "completed",
                    "output": [done_call],
                    "usage": usage,
                    "metadata": meta,
                },
            ),
        ]
        self.text = opening + [
            event(
                "response.output_text.delta",
                sequence_number=2,
                item_id="msg_" + ID,
                output_index=0,
                content_index=0,
                delta="Done: the tests pass.",
            ),
            event("response.output_item.done", sequence_number=3, output_index=0, item=message),
            event(
                "response.completed",
                sequence_number=4,
                response={
                    **base,
                    "status": "completed",
                    "output": [message],
                    "usage": usage,
                    "metadata": meta,
                },
            ),
        ]

    @staticmethod
    def fill(frames: list[list[str]], rid: str) -> list[str]:
        return [rid.join(parts) for parts in frames]


# ----------------------------------------------------------------------------- recorded frames

RID, PREV = ID, "@@prev@@"  # the slots of a recorded frame
_SLOT = re.compile(f"({RID}|{PREV})")
KINDS = ("first", "steady", "final")  # the recorded answers: a call, a chained call, the text


def ids_of(response: dict[str, Any]) -> dict[str, str]:
    """The ids a Response's frames carry, each with its slot: the response's own, the
    ``previous_response_id``, each output item's id and ``call_id`` (the same prefix kept:
    ``fc_…`` stays ``fc_…``)."""
    out: dict[str, str] = {}
    if response.get("id"):
        out[response["id"]] = f"{response['id'].split('_', 1)[0]}_{RID}"
    if response.get("previous_response_id"):
        out[response["previous_response_id"]] = PREV
    for k, item in enumerate(response.get("output") or []):
        for key in ("id", "call_id"):
            value = item.get(key)
            if isinstance(value, str) and value and value not in out:
                out[value] = f"{value.split('_', 1)[0]}_{RID}{k}{key[0]}"
    return out


def zero_timings(raw: str, response: dict[str, Any]) -> str:
    """``raw`` (the final frame) with every phase of its timings at zero: model time zero."""
    old = ((response.get("metadata") or {}).get(TIMINGS_KEY)) or ""
    try:
        phases = json.loads(old) if old else {}
    except ValueError:
        return raw
    if not isinstance(phases, dict):
        return raw
    # the host's event-loop lag is no phase, and the reference has no host: left out
    kept = [k for k in phases if k != "loop_lag"]
    zero = json.dumps(dict.fromkeys(kept, 0.0) or json.loads(TIMINGS), separators=(",", ":"))
    encoded = json.dumps(old)
    if encoded in raw:
        return raw.replace(encoded, json.dumps(zero), 1)
    event = json.loads(raw)  # encoded otherwise: re-encode it compactly, as the server does
    event["response"]["metadata"][TIMINGS_KEY] = zero
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def template(frames: list[str]) -> list[str]:
    """A server's answer (raw frames, the last one final) as a template: its ids in
    :data:`RID`/:data:`PREV` slots, its model time zero."""
    last = json.loads(frames[-1])
    response = last.get("response") or {}
    ids = ids_of(response)
    out = [*frames[:-1], zero_timings(frames[-1], response)]
    for value in sorted(ids, key=len, reverse=True):  # the longest first: none is cut
        out = [f.replace(f'"{value}"', f'"{ids[value]}"') for f in out]
    return out


def fill(parts: list[list[str]], rid: str, prev: str) -> list[str]:
    """The frames of a compiled template (:func:`compile_frames`) with their ids."""
    return ["".join(rid if p == RID else prev if p == PREV else p for p in frame) for frame in parts]


def compile_frames(frames: list[str]) -> list[list[str]]:
    return [_SLOT.split(f) for f in frames]


def choose(create: dict[str, Any], results: int, rounds: int) -> tuple[str, int]:
    """Which recorded answer a create gets, and its chain's tool results in context after it:
    ``results`` before it (when it continues a chain) plus its ``function_call_output`` items,
    against its ``metadata["emulator.tool_rounds"]`` (``rounds`` without one)."""
    chained = bool(create.get("previous_response_id"))
    items = create.get("input")
    new = (
        sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
        if isinstance(items, list)
        else 0
    )
    total = (results if chained else 0) + new
    meta = create.get("metadata") or {}
    try:
        limit = int(meta.get("emulator.tool_rounds", rounds))
    except (TypeError, ValueError):
        limit = rounds
    if total >= limit:
        return "final", total
    return ("steady" if chained else "first"), total


# ----------------------------------------------------------------------------- recording


async def record(url: str, make: Callable[[str, dict[str, Any] | None], str]) -> dict[str, list[str]]:
    """Record a server's answers to a first create and the chained ones after it, on one
    socket: ``make(kind, previous response)`` gives each create; the frames of each answer
    as received, templated (:func:`template`), keyed by :data:`KINDS` in order."""
    from .client import connect, is_final_frame

    out: dict[str, list[str]] = {}
    previous: dict[str, Any] | None = None
    async with connect(url) as sock:
        for kind in KINDS:
            await sock.send_raw(make(kind, previous))
            frames = [await sock.recv_raw()]
            while not is_final_frame(frames[-1]):
                frames.append(await sock.recv_raw())
            last = json.loads(frames[-1])
            if last.get("type") != "response.completed":
                raise RuntimeError(
                    f"recording the reference's frames: the {kind} turn ended {frames[-1][:200]}"
                )
            previous = last["response"]
            out[kind] = template(frames)
    return out


# ----------------------------------------------------------------------------- the server


class Answers:
    """A connection's answers: the recorded ones, or synthesized from its first create."""

    def __init__(self, recorded: dict[str, list[str]] | None) -> None:
        self.parts = {k: compile_frames(v) for k, v in (recorded or {}).items()}

    def frames(self, kind: str, create: dict[str, Any], rid: str, prev: str) -> list[str]:
        if not self.parts:  # synthesized from this connection's first create
            synth = Frames(create)
            tool, text = [ID.join(f) for f in synth.tool], [ID.join(f) for f in synth.text]
            self.parts = {
                "first": compile_frames(tool),
                "steady": compile_frames(tool),
                "final": compile_frames(text),
            }
        return fill(self.parts[kind], rid, prev)


async def _connection(ws: Any, recorded: dict[str, list[str]] | None, rounds: int, serial: int) -> None:
    answers = Answers(recorded)
    results = 0
    turn = 0
    async for raw in ws:
        create = json.loads(raw)  # every create parsed, as any server must
        turn += 1
        kind, results = choose(create, results, rounds)
        prev = create.get("previous_response_id") or ""
        for frame in answers.frames(kind, create, f"{serial:x}_{turn}", prev):
            await ws.send(frame)


async def serve(
    host: str, port: int, rounds: int, ready: Any = None, recorded: dict[str, list[str]] | None = None
) -> None:
    """Serve until cancelled; ``ready(url)`` is called once it listens."""
    from websockets.asyncio.server import serve as ws_serve

    serials = itertools.count(1)

    async def handler(ws: Any) -> None:
        try:
            await _connection(ws, recorded, rounds, next(serials))
        except Exception:  # noqa: BLE001 - a client gone mid-answer ends its connection only
            return

    async with ws_serve(handler, host, port, max_size=None, compression=None) as server:
        bound = next(iter(server.sockets)).getsockname()
        if ready is not None:
            ready(f"http://{bound[0]}:{bound[1]}")
        await asyncio.Future()


class ReferenceServer:
    """The reference server in a child process; ``with`` gives its base URL and ends it.
    ``recorded``: the answers (:func:`record`), handed to the child on its standard input;
    without them it synthesizes its own."""

    def __init__(
        self,
        rounds: int = 8,
        host: str = "127.0.0.1",
        port: int = 0,
        recorded: dict[str, list[str]] | None = None,
    ) -> None:
        self.args = ["--rounds", str(rounds), "--host", host, "--port", str(port)]
        self.recorded = recorded
        if recorded is not None:
            self.args += ["--frames", "-"]
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.reference", *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.recorded is not None:
            self.proc.stdin.write(json.dumps(self.recorded))
        self.proc.stdin.close()
        line = self.proc.stdout.readline()  # the child prints its URL once it listens, or exits
        if not line.startswith(READY_PREFIX):
            self.__exit__()
            raise RuntimeError(f"the reference server did not start: {line.strip() or 'no output'}")
        self.url = line[len(READY_PREFIX) :].strip()
        return self.url

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.reference", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument(
        "--rounds",
        type=int,
        default=8,
        help="tool results before the text answer, when a create does not say",
    )
    p.add_argument(
        "--frames", help="a file of recorded answers (JSON: first, steady, final); -: standard input"
    )
    args = p.parse_args(argv)
    text = (
        None if not args.frames else sys.stdin.read() if args.frames == "-" else Path(args.frames).read_text()
    )
    recorded = json.loads(text) if text else None
    if recorded is not None and set(recorded) != set(KINDS):
        print(f"--frames {args.frames}: needs the answers {', '.join(KINDS)}", file=sys.stderr)
        return 2
    try:
        asyncio.run(
            serve(
                args.host,
                args.port,
                args.rounds,
                lambda url: print(READY_PREFIX + url, flush=True),
                recorded,
            )
        )
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
