"""A pinned session's memo work per turn, as the engine does it (recall the conversation a
prompt extends, remember the prompt and the output), in this process, against the same work
on the memo of an earlier commit.

    python -m investigations.prompt_memo_turn [--against f4398ab] [--rounds 3]

The conversation grows from 60k to 150k tokens (400 new tokens and a 50-token output a
turn); prints each round's median ms a turn, for the earlier commit's module (read with
``git show``: it verified the remembered prefix by a CRC-32 and an Adler-32 over it) and for
this checkout's (docs/performance.md, "The emulator replica's part of a turn").
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from array import array
from types import ModuleType

from investigations.prefix_cache_turn import REPO, earlier_module, load

SESSION = "s"


def _earlier_turn(m: ModuleType, memo, data: bytes, output: array) -> None:  # type: ignore[no-untyped-def]
    known, whole = memo.recall(SESSION, 0, data)
    assert known is not None or len(memo) == 0
    out = output.tobytes()
    memo.remember(SESSION, m.Known(len(data) // 4 + len(output), m.check(out, whole), 0, ()))


def _this_turn(m: ModuleType, memo, data: bytes, output: array) -> None:  # type: ignore[no-untyped-def]
    known = memo.recall(SESSION, 0, data)
    assert known is not None or len(memo) == 0
    memo.remember(SESSION, m.Known(data, output.tobytes(), 0, ()))


def median_ms(m: ModuleType, turn) -> float:  # type: ignore[no-untyped-def]
    rng = random.Random(1)
    prompt = array("I", (rng.randrange(100_000) for _ in range(60_000)))
    memo = m.PromptMemo()
    took = []
    for i in range(225):
        prompt.extend(range(i, i + 400))
        data, output = prompt.tobytes(), array("I", range(50))  # the engine's one copy, as it makes it
        t = time.perf_counter()
        turn(m, memo, data, output)
        took.append(time.perf_counter() - t)
        prompt.extend(output)
    return statistics.median(took) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", default="f4398ab", help="the earlier commit")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    earlier = earlier_module(args.against, "inference/prompt_memo.py", "prompt_memo_earlier")
    this = load(REPO / "inference" / "prompt_memo.py", "prompt_memo_this")
    for r in range(args.rounds):
        a, b = median_ms(earlier, _earlier_turn), median_ms(this, _this_turn)
        print(f"round {r + 1}: {args.against} {a:.3f} ms a turn, this checkout {b:.3f} ms a turn")


if __name__ == "__main__":
    main()
