"""A session's resumable state as plain data, and back (docs/reliability.md, "Resuming on any
node").  Sans-I/O, like the session: the host seals and writes it (:mod:`store.connection_states`).

What a ``store:false`` chain needs to go on: each lane's latest response as its items (the
conversation a stored record keeps: rendered tokens, the classifier's state and the tool
caches are rebuilt from them the way a stored parent is, :func:`~actors.core.context.from_record`),
the inference replica that served it (where its prefix is cached: the next call's
``replica_hint``), and the steer input waiting for a response that stopped on function calls.  Tool
definitions are not inherited across responses (each ``response.create`` sends its own), so
there are none to keep.  Responses in flight are not part of it: as on any resume, they are
cancelled.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from inference.formats import ChatFormat
from store import StoredResponse

from ..protocol import ITEM_ADAPTER, RequiredInput
from .context import ContextEntry, from_record
from .lanes import Lanes
from .safety import Classifier
from .steering import Steering, WaitingSteer
from .timings import PhaseTimer
from .turn import Effects

VERSION = 1


def snapshot(lanes: Lanes, steering: Steering) -> bytes:
    """The state as JSON (every lane's latest finished response, the steer input waiting)."""
    data: dict[str, Any] = {
        "v": VERSION,
        "lanes": [
            {  # the items first: a turn appends to them, so its change is one run of new bytes
                "lane": name,  # followed by what it replaces (store.splice)
                "items": lane.latest.items,
                "id": lane.latest.response_id,
                "store": lane.latest.store,
                "fmt": lane.latest.fmt,
                "replica": lane.latest.replica,
            }
            for name, lane in lanes.items()
            if lane.latest is not None
        ],
        "steers": [
            {
                "id": w.response_id,
                "lane": w.lane,
                "seq": w.seq,
                "items": ITEM_ADAPTER.dump_python(w.items, mode="json", exclude_none=True),
                "calls": [c.model_dump(mode="json") for c in w.calls],
            }
            for w in steering.waiting()
        ],
    }
    return json.dumps(data, separators=(",", ":")).encode()


def restore(
    raw: bytes,
    lanes: Lanes,
    steering: Steering,
    *,
    new_scan: Callable[[], Classifier],
    fmt: Callable[[str | None], ChatFormat],
    owner: str,
    timer: PhaseTimer,
) -> Effects:
    """Put a :func:`snapshot` back into fresh ``lanes`` and ``steering``; each lane's
    conversation is rebuilt from its items as a stored parent is (``fmt``: the chat format
    of a lane, by its name; cl100k unless a real model's).  The effects: other connections'
    lanes the host's budget evicted to make room."""
    fx = Effects()
    data = json.loads(raw)
    if data.get("v") != VERSION:
        raise ValueError(f"unknown continuity state version {data.get('v')!r}")
    for lane in data["lanes"]:
        record = StoredResponse(lane["id"], owner, 0.0, {}, [], lane["items"])
        entry = from_record(record, new_scan, timer, fmt(lane.get("fmt")))
        entry = ContextEntry(
            entry.response_id,
            entry.tokens,
            entry.items,
            entry.call_ids,
            entry.tool_results,
            bool(lane["store"]),
            entry.scan,
            fresh_tokens=entry.fresh_tokens,
            fmt=entry.fmt,
            replica=lane.get("replica", ""),  # where its prefix is cached: the next call's hint
            marks=entry.marks,
        )
        lanes.open(lane["lane"])
        fx.evict += lanes.remember(lane["lane"], entry)
    for steer in data["steers"]:
        steering.restore(
            WaitingSteer(
                response_id=steer["id"],
                lane=steer["lane"],
                seq=steer["seq"],
                items=list(ITEM_ADAPTER.validate_python(steer["items"])),
                calls=[RequiredInput(**c) for c in steer["calls"]],
            )
        )
    return fx
