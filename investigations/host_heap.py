"""What a session host's heap holds per connection under a crowd, by type, and what a
steady turn leaves for the collector.

    python -m investigations.host_heap [--connections 256] [--turns 8] [--top 25]

Imports what a server process imports, freezes the start-up objects as a host does
(``inference.collector.freeze_startup``), then drives ``--connections`` session cores in
this process (``investigations.gc_pause``'s crowd: the product's driver, Codex-like turns
round-robin, no Ray, no sockets).  Prints, as JSON:

- ``held_by_sessions``: the objects the collector tracks that the session cores reach once
  the crowd is built (after a full collection; the frozen start-up objects are not walked
  and not counted), in all and per connection, by type — what every full collection walks
  for them (``tracked``: all the process's, the driver's own included);
- ``one_session_by_attribute``: one session's, by the attribute that reaches them (what
  another session reaches too, the host's shared parts, left out);
- ``made_per_turn``: the tracked objects a round of steady turns left in the youngest
  generation (the collector off meanwhile), per turn, by type — what gen-0 collections
  walk, and promote when a turn is still in flight at its collection.
"""

from __future__ import annotations

import argparse
import gc
import json
from collections import Counter
from typing import Any

from .gc_pause import build


def per(counts: Counter[str], n: int, top: int) -> dict[str, float]:
    return {name: round(c / n, 2) for name, c in counts.most_common(top)}


def reachable(root: object, walked: set[int], counted: set[int]) -> Counter[str]:
    """The tracked, non-frozen objects reachable from ``root`` (not through another
    connection's state, ``walked``), by type."""
    found: Counter[str] = Counter()
    stack = [root]
    seen: set[int] = set()
    while stack:
        o = stack.pop()
        if id(o) in seen or id(o) not in counted or id(o) in walked:
            continue
        seen.add(id(o))
        found[type(o).__qualname__] += 1
        stack.extend(gc.get_referents(o))
    return found


def owned(session: Any, other: Any) -> dict[str, Any]:
    """One session's tracked objects by the attribute that reaches them (objects another
    session also reaches, the host's shared parts, are left out)."""
    gc.collect()
    counted = {id(o) for o in gc.get_objects()}
    shared = {id(o) for o in _closure(other, counted)}
    out: dict[str, Any] = {}
    for name, value in sorted(vars(session).items()):
        got = reachable(value, shared, counted)
        if got:
            out[name] = {"total": sum(got.values()), "by_type": dict(got.most_common(8))}
    return out


def _closure(root: object, counted: set[int]) -> list[object]:
    out: list[object] = []
    stack = [root]
    seen: set[int] = set()
    while stack:
        o = stack.pop()
        if id(o) in seen or id(o) not in counted:
            continue
        seen.add(id(o))
        out.append(o)
        stack.extend(gc.get_referents(o))
    return out


def measure(connections: int, turns: int, top: int) -> dict[str, Any]:
    sessions, turn = build(connections, freeze=True)
    for i in range(turns):
        for k in range(connections):
            turn(k, i)
    gc.collect()
    tracked = {id(o) for o in gc.get_objects()}
    held = Counter(type(o).__qualname__ for o in _closure(sessions, tracked))
    gc.disable()
    before = len(gc.get_objects(generation=0))
    for k in range(connections):
        turn(k, turns)
    young = gc.get_objects(generation=0)
    made = Counter(type(o).__qualname__ for o in young)
    made_n = len(young) - before
    del young
    gc.enable()
    return {
        "connections": connections,
        "turns": turns,
        "frozen": gc.get_freeze_count(),
        "tracked": len(tracked),
        "held_by_sessions": {
            "total": sum(held.values()),
            "per_connection": round(sum(held.values()) / connections, 1),
        },
        "held_per_connection_by_type": per(held, connections, top),
        "one_session_by_attribute": owned(sessions[0], sessions[1]),
        "made_per_turn": {"total": round(made_n / connections, 1), "by_type": per(made, connections, top)},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    print(json.dumps(measure(args.connections, args.turns, args.top), indent=1))


if __name__ == "__main__":
    main()
