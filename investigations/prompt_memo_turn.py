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

import random
import statistics
import time
from array import array
from types import ModuleType

from investigations.earlier import compare

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
    compare(
        __doc__,
        "inference/emulator/prompt_memo.py",
        "f4398ab",
        lambda m: median_ms(m, _earlier_turn),
        lambda m: median_ms(m, _this_turn),
    )


if __name__ == "__main__":
    main()
