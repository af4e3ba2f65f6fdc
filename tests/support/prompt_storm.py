"""A storm of first turns sharing one system prompt, on one session host, in process: the CPU
each first create costs the session core (parse, validate, render, build the call) with the
host's shared instructions and tools (actors.core.prompt_parts) and without (docs/performance.md).

    python -m tests.support.prompt_storm [connections] [instruction_words] [tools] [rounds]

Each round makes ``connections`` fresh sessions and hands each its first create — the same
instructions and tools, a different input — alternating the two setups round by round;
prints the median and range over rounds of the mean CPU ms per first create.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time

from actors.config import SessionConfig
from actors.core.inputs import ClientFrame
from actors.core.prepare import SharedParts
from actors.core.prompt_parts import PromptParts
from actors.core.session import Session
from tests.support.session_driver import handled

MODEL = "emu-fast"
VOCAB = [
    "agent", "apply", "patch", "shell", "command", "sandbox", "approval", "workspace", "file", "read",
    "write", "test", "lint", "format", "review", "plan", "step", "output", "user", "request", "never",
    "always", "carefully", "explain", "summarise", "diff", "repository", "branch", "commit", "tool",
]  # fmt: skip


def storm_inputs(words: int, tools: int, seed: int = 1) -> tuple[str, list[dict[str, object]]]:
    rng = random.Random(seed)
    text = " ".join(rng.choice(VOCAB) for _ in range(words))
    defs: list[dict[str, object]] = [
        {
            "type": "function",
            "name": f"tool_{i}",
            "description": " ".join(rng.choice(VOCAB) for _ in range(30)),
            "parameters": {
                "type": "object",
                "properties": {
                    f"arg_{j}": {"type": "string", "description": rng.choice(VOCAB)} for j in range(4)
                },
                "required": ["arg_0"],
            },
        }
        for i in range(tools)
    ]
    return text, defs


def one_round(
    connections: int, text: str, tools: list[dict[str, object]], parts: SharedParts | None
) -> float:
    """Mean CPU ms per first create over ``connections`` fresh sessions."""
    frames = [
        json.dumps(
            {
                "type": "response.create",
                "model": MODEL,
                "store": False,
                "input": f"task {i}",
                "instructions": text,
                "tools": tools,
            }
        )
        for i in range(connections)
    ]
    sessions = [
        Session(SessionConfig(), [MODEL], session_key=f"c{i}", clock=time.time, prompt_parts=parts)
        for i in range(connections)
    ]
    t0 = time.process_time()
    for session, frame in zip(sessions, frames, strict=True):
        (_call,) = handled(session, ClientFrame(frame)).start
    return (time.process_time() - t0) * 1000 / connections


def main(connections: int = 256, words: int = 8000, tools: int = 20, rounds: int = 6) -> None:
    text, defs = storm_inputs(words, tools)
    one_round(4, text, defs, None)  # warm: the tokenizer loaded
    got: dict[str, list[float]] = {"per connection": [], "shared by the host": []}
    for r in range(rounds):
        order = (
            ["per connection", "shared by the host"]
            if r % 2 == 0
            else ["shared by the host", "per connection"]
        )
        for name in order:
            got[name].append(
                one_round(connections, text, defs, PromptParts() if name.startswith("shared") else None)
            )
    print(f"{connections} first creates, {words}-word instructions, {tools} tools, {rounds} rounds")
    for name, ms in got.items():
        print(
            f"  {name:<20} {statistics.median(ms):7.3f} ms CPU a first create (rounds {min(ms):.3f}-{max(ms):.3f})"
        )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
