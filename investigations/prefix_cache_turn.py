"""A pinned session's prefix-cache work per turn, as the engine does it (a lookup, the prompt
inserted once prefill is done, the prompt and the output inserted at the end), in this
process, against the same work on the prefix cache of an earlier commit.

    python -m investigations.prefix_cache_turn [--against 10bcebe] [--rounds 3]

The conversation grows from 60k to 150k tokens (400 new tokens and a 50-token output a turn,
blocks of 32); prints each round's median ms a turn, for the earlier commit's module (read
with ``git show``, which walked and refreshed every block a prompt hit and copied the whole
prompt to bytes for each key computation) and for this checkout's (docs/performance.md,
"The emulator replica's part of a turn").
"""

from __future__ import annotations

import random
import statistics
import time
from array import array
from types import ModuleType

from investigations.earlier import compare

BLOCK = 32
ROOT = 7


def _earlier_turn(m: ModuleType, cache, prompt: array, output: array, keys):  # type: ignore[no-untyped-def]
    found = cache.lookup(prompt, ROOT, keys)
    cache.insert(prompt, found.keys, ROOT)
    whole = array("I", prompt)
    whole.extend(output)
    keys = m.block_keys(whole, BLOCK, found.keys, ROOT)
    cache.insert_keys(keys)
    return keys


def _this_turn(m: ModuleType, cache, prompt: array, output: array, keys):  # type: ignore[no-untyped-def]
    found = cache.lookup(prompt, ROOT, keys)
    cache.insert_keys(m.block_keys(prompt, BLOCK, found.keys, ROOT))
    start = min(len(found.keys), len(prompt) // BLOCK) * BLOCK
    tail = array("I", prompt[start:])
    tail.extend(output)
    keys = [*found.keys[: start // BLOCK], *m.chain_keys(tail, BLOCK, found.keys[start // BLOCK - 1])]
    cache.insert_keys(keys)
    return keys


def median_ms(m: ModuleType, turn) -> float:  # type: ignore[no-untyped-def]
    rng = random.Random(1)
    prompt = array("I", (rng.randrange(100_000) for _ in range(60_000)))
    cache = m.PrefixCache(1_000_000 // BLOCK, BLOCK)
    keys = m.block_keys(prompt, BLOCK, (), ROOT)
    cache.insert_keys(keys)
    took = []
    for i in range(225):
        prompt.extend(range(i, i + 400))
        output = array("I", range(50))
        t = time.perf_counter()
        keys = turn(m, cache, prompt, output, keys)
        took.append(time.perf_counter() - t)
        prompt.extend(output)
    return statistics.median(took) * 1000


def main() -> None:
    compare(
        __doc__,
        "inference/emulator/prefix_cache.py",
        "10bcebe",
        lambda m: median_ms(m, _earlier_turn),
        lambda m: median_ms(m, _this_turn),
    )


if __name__ == "__main__":
    main()
