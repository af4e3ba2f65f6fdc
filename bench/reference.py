"""A bare-protocol reference server: WebSocket mode at its cheapest, in a process of its own.

It answers each ``response.create`` at once with frames encoded ahead (no model, no store,
no history): ``response.created`` and ``response.in_progress`` (the Response, echoing the
instructions and tools as the real server does), a function call's ``output_item.added``,
one arguments delta, ``arguments.done``, ``output_item.done``, and ``response.completed``
(with zero model timings in ``metadata["responses_ws.timings"]``).  A create without
``previous_response_id`` starts a chain; the chain's ``rounds``-th chained create is
answered with a text message instead (the rollout ends).  The frames are built from a
connection's first create (parsed once, for its model, instructions and tools); later
creates are not parsed.

What it is for: measuring a client against a server that costs as little as possible
(the load runner's own capacity, ``responses-ws bench capacity --reference``), and the
per-turn floor of the protocol itself.

    with ReferenceServer(rounds=8) as url:   # a child process on a free loopback port
        ...                                   # url: http://127.0.0.1:PORT

    python -m bench.reference [--host 127.0.0.1] [--port 0] [--rounds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

TIMINGS = json.dumps({"queue": 0.0, "prefill": 0.0, "decode": 0.0, "api_overhead": 0.0})
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


async def _connection(ws: Any, rounds: int) -> None:
    frames: Frames | None = None
    serial = 0
    chained = 0
    async for raw in ws:
        if frames is None:
            frames = Frames(json.loads(raw))
        serial += 1
        rid = f"{id(ws):x}_{serial}"
        chained = chained + 1 if '"previous_response_id"' in raw else 0
        answer = frames.text if chained >= rounds else frames.tool
        for frame in Frames.fill(answer, rid):
            await ws.send(frame)


async def serve(host: str, port: int, rounds: int, ready: Any = None) -> None:
    """Serve until cancelled; ``ready(url)`` is called once it listens."""
    from websockets.asyncio.server import serve as ws_serve

    async def handler(ws: Any) -> None:
        try:
            await _connection(ws, rounds)
        except Exception:  # noqa: BLE001 - a client gone mid-answer ends its connection only
            return

    async with ws_serve(handler, host, port, max_size=None, compression=None) as server:
        bound = next(iter(server.sockets)).getsockname()
        if ready is not None:
            ready(f"http://{bound[0]}:{bound[1]}")
        await asyncio.Future()


class ReferenceServer:
    """The reference server in a child process; ``with`` gives its base URL and ends it."""

    def __init__(self, rounds: int = 8, host: str = "127.0.0.1", port: int = 0) -> None:
        self.args = ["--rounds", str(rounds), "--host", host, "--port", str(port)]
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.reference", *self.args], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
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
    p.add_argument("--rounds", type=int, default=8, help="chained creates answered with a tool call")
    args = p.parse_args(argv)
    try:
        asyncio.run(
            serve(args.host, args.port, args.rounds, lambda url: print(READY_PREFIX + url, flush=True))
        )
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
