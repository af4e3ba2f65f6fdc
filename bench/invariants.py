"""Invariants of WebSocket-mode event streams, checked for every response of a run.

Sans-I/O: a client tells a connection's :class:`ConnectionCheck` about every
``response.create`` it sends (``create_sent``) and hands it every server event it receives
(``feed``); ``close()`` when the connection ends.  Violations accumulate in the run's
:class:`RunCheck`, which also guards what must be unique across the whole run.

What is checked (docs/protocol.md):

- §3.1: ``sequence_number`` is 0 on ``response.created`` and grows by exactly 1 per event
  of that response; default-lane events carry no ``stream_id``; every create ends with
  exactly one terminal event (``completed``/``incomplete``/``failed``), or with an
  ``error`` event if it never started (counted as a violation here: this run expects every
  create to succeed).
- §3.2 / §3.3: the exact event order of message and function-call items, with
  ``item_id``/``output_index``/``content_index`` matching the announced item and deltas
  concatenating to the ``done`` values; the terminal response lists exactly the streamed
  items, has ``usage`` with ``total_tokens = input + output``.
- §4: ``response.created`` echoes the ``previous_response_id`` the create sent (the chain's
  server-side state held); no response id, item id or call id repeats in the run; nothing
  is lost (a create without a terminal event when the connection ends).

The grammar is a transition table over :class:`Phase`; a violation is recorded and the
event is otherwise ignored, so one bad event does not hide later ones.
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from .client import TERMINAL_EVENT_TYPES

# terminal event type → the status of the response it carries
TERMINAL_STATUS = {t: t.removeprefix("response.") for t in TERMINAL_EVENT_TYPES}
MAX_EXAMPLES = 20


class Phase(enum.Enum):
    CREATED = "awaiting response.created"
    IN_PROGRESS = "awaiting response.in_progress"
    ITEMS = "between output items"
    MESSAGE = "in a message item, between content parts"
    TEXT = "in an output_text part"
    TEXT_DONE = "after output_text.done"
    CALL = "in a function_call item"
    CALL_DONE = "after function_call_arguments.done"


# (phase, event type) -> next phase; output_item.added picks MESSAGE or CALL by item type.
GRAMMAR: dict[tuple[Phase, str], Phase | None] = {
    (Phase.CREATED, "response.created"): Phase.IN_PROGRESS,
    (Phase.IN_PROGRESS, "response.in_progress"): Phase.ITEMS,
    (Phase.ITEMS, "response.output_item.added"): None,
    (Phase.MESSAGE, "response.content_part.added"): Phase.TEXT,
    (Phase.MESSAGE, "response.output_item.done"): Phase.ITEMS,
    (Phase.TEXT, "response.output_text.delta"): Phase.TEXT,
    (Phase.TEXT, "response.output_text.done"): Phase.TEXT_DONE,
    (Phase.TEXT_DONE, "response.content_part.done"): Phase.MESSAGE,
    (Phase.CALL, "response.function_call_arguments.delta"): Phase.CALL,
    (Phase.CALL, "response.function_call_arguments.done"): Phase.CALL_DONE,
    (Phase.CALL_DONE, "response.output_item.done"): Phase.ITEMS,
    **{(Phase.ITEMS, t): Phase.CREATED for t in TERMINAL_STATUS},
}
ITEM_PHASE = {"message": Phase.MESSAGE, "function_call": Phase.CALL}


@dataclass(frozen=True)
class Violation:
    # sequence, order, consistency, duplicate_id, stray_event, error_event, not_completed,
    # chain, lost, stream_id; and the client's own: connection
    kind: str
    conn: str
    response_id: str | None
    detail: str


@dataclass
class RunCheck:
    """Everything one run saw: counters, violations by kind, the first few examples."""

    counts: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    examples: list[Violation] = field(default_factory=list)
    _ids: set[str] = field(default_factory=set)

    def connection(self, name: str) -> ConnectionCheck:
        self.counts["connections"] += 1
        return ConnectionCheck(self, name)

    def violate(self, kind: str, conn: str, response_id: str | None, detail: str) -> None:
        self.violations[kind] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(Violation(kind, conn, response_id, detail[:300]))

    def unique(self, ident: Any, what: str, conn: str, response_id: str | None) -> None:
        if not isinstance(ident, str) or not ident:
            self.violate("consistency", conn, response_id, f"{what} id missing: {ident!r}")
        elif ident in self._ids:
            self.violate("duplicate_id", conn, response_id, f"{what} id {ident} seen before in this run")
        else:
            self._ids.add(ident)

    def merge(self, other: RunCheck) -> None:
        """Fold in another client process's check of the same run: its counts, violations and
        examples; an id both saw is a ``duplicate_id``."""
        self.counts.update(other.counts)
        self.violations.update(other.violations)
        self.examples.extend(other.examples[: max(0, MAX_EXAMPLES - len(self.examples))])
        for ident in sorted(other._ids & self._ids):
            self.violate("duplicate_id", "-", None, f"id {ident} seen by two client processes or runs")
        self._ids |= other._ids

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": dict(self.counts),
            "violations": dict(self.violations),
            "examples": [vars(v) for v in self.examples],
        }


@dataclass
class _Item:
    id: str | None  # None: missing (a violation, reported)
    type: str
    index: int
    parts: list[str] = field(default_factory=list)  # finished text of each content part
    text: str = ""  # the open part's deltas / the arguments
    call_id: str | None = None


class ConnectionCheck:
    """One connection's creates and events (default lane: responses run one after another)."""

    def __init__(self, run: RunCheck, name: str) -> None:
        self.run = run
        self.name = name
        self._pending: deque[str | None] = deque()  # previous_response_id of each unanswered create
        self._phase = Phase.CREATED
        self._seq = 0
        self._rid: str | None = None
        self._items: list[_Item] = []

    def create_sent(self, previous_response_id: str | None) -> None:
        self.run.counts["creates"] += 1
        self._pending.append(previous_response_id)

    def close(self) -> None:
        """The connection ended: every unanswered create is lost."""
        for _ in self._pending:
            self._violate("lost", "create sent, no terminal event before the connection closed")
        self._pending.clear()

    # -- events
    def _violate(self, kind: str, detail: str) -> None:
        self.run.violate(kind, self.name, self._rid, detail)

    def feed(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        self.run.counts["events"] += 1
        if not self._pending:
            self._violate(
                "stray_event", f"{kind} (seq {ev.get('sequence_number')}) with no create outstanding"
            )
            return
        if "stream_id" in ev:
            self._violate("stream_id", f"{kind} carries stream_id {ev['stream_id']!r} on the default lane")
        if kind == "error" and self._phase is Phase.CREATED:
            self.run.counts["errors"] += 1
            self._violate("error_event", f"create answered with error {ev.get('error')}")
            self._end()
            return
        if ev.get("sequence_number") != (0 if self._phase is Phase.CREATED else self._seq + 1):
            self._violate(
                "sequence",
                f"{kind}: sequence_number {ev.get('sequence_number')}, expected "
                f"{0 if self._phase is Phase.CREATED else self._seq + 1}",
            )
        if isinstance(ev.get("sequence_number"), int):
            self._seq = ev["sequence_number"]
        key = (self._phase, kind)
        if key not in GRAMMAR:
            self._violate("order", f"{kind} not allowed {self._phase.value}")
            return
        nxt = GRAMMAR[key]
        assert isinstance(kind, str)  # a key of GRAMMAR
        getattr(self, "_on_" + kind.removeprefix("response.").replace(".", "_"))(ev)
        if nxt is not None:
            self._phase = nxt

    def _end(self) -> None:
        self._pending.popleft()
        self._phase, self._rid, self._items = Phase.CREATED, None, []

    def _same(self, what: str, got: Any, want: Any) -> None:
        if got != want:
            self._violate("consistency", f"{what}: {got!r} != {want!r}")

    # -- one handler per event type the grammar allows
    def _on_created(self, ev: dict[str, Any]) -> None:
        r = ev.get("response") or {}
        self._rid = r.get("id")
        self.run.counts["created"] += 1
        self.run.unique(self._rid, "response", self.name, self._rid)
        self._same("created status", r.get("status"), "in_progress")
        self._same("created output", r.get("output"), [])
        self._same("created usage", r.get("usage"), None)
        if r.get("previous_response_id") != self._pending[0]:
            self._violate(
                "chain",
                f"previous_response_id {r.get('previous_response_id')!r}, "
                f"the create sent {self._pending[0]!r}",
            )

    def _on_in_progress(self, ev: dict[str, Any]) -> None:
        self._same("in_progress id", (ev.get("response") or {}).get("id"), self._rid)

    def _on_output_item_added(self, ev: dict[str, Any]) -> None:
        item = ev.get("item") or {}
        self._same("output_index", ev.get("output_index"), len(self._items))
        self._same("added item status", item.get("status"), "in_progress")
        if item.get("type") not in ITEM_PHASE:
            self._violate("order", f"output item of unexpected type {item.get('type')!r}")
            item = {**item, "type": "message"}  # keep going with the message grammar
        it = _Item(item.get("id"), item["type"], len(self._items))
        self.run.unique(it.id, "item", self.name, self._rid)
        if it.type == "function_call":
            it.call_id = item.get("call_id")
            self.run.unique(it.call_id, "call", self.name, self._rid)
            self._same("added arguments", item.get("arguments"), "")
        else:
            self._same("added content", item.get("content"), [])
        self._items.append(it)
        self._phase = ITEM_PHASE[it.type]

    def _check_item(self, ev: dict[str, Any], content_index: int | None = None) -> _Item:
        it = self._items[-1]
        self._same("item_id", ev.get("item_id"), it.id)
        self._same("output_index", ev.get("output_index"), it.index)
        if content_index is not None:
            self._same("content_index", ev.get("content_index"), content_index)
        return it

    def _on_content_part_added(self, ev: dict[str, Any]) -> None:
        it = self._check_item(ev, len(self._items[-1].parts))
        self._same("added part text", (ev.get("part") or {}).get("text"), "")
        it.text = ""

    def _on_output_text_delta(self, ev: dict[str, Any]) -> None:
        it = self._check_item(ev, len(self._items[-1].parts))
        it.text += ev.get("delta") or ""

    def _on_output_text_done(self, ev: dict[str, Any]) -> None:
        it = self._check_item(ev, len(self._items[-1].parts))
        self._same("output_text.done text vs deltas", ev.get("text"), it.text)

    def _on_content_part_done(self, ev: dict[str, Any]) -> None:
        it = self._check_item(ev, len(self._items[-1].parts))
        self._same("content_part.done text vs deltas", (ev.get("part") or {}).get("text"), it.text)
        it.parts.append(it.text)

    def _on_function_call_arguments_delta(self, ev: dict[str, Any]) -> None:
        self._check_item(ev).text += ev.get("delta") or ""

    def _on_function_call_arguments_done(self, ev: dict[str, Any]) -> None:
        it = self._check_item(ev)
        self._same("arguments.done vs deltas", ev.get("arguments"), it.text)

    def _on_output_item_done(self, ev: dict[str, Any]) -> None:
        it = self._items[-1]
        item = ev.get("item") or {}
        self._same("output_index", ev.get("output_index"), it.index)
        self._same("done item id", item.get("id"), it.id)
        self._same("done item status", item.get("status"), "completed")
        if it.type == "function_call":
            self._same("done item arguments", item.get("arguments"), it.text)
            self._same("done item call_id", item.get("call_id"), it.call_id)
        else:
            self._same("done item text", [c.get("text") for c in item.get("content") or []], it.parts)

    def _on_terminal(self, ev: dict[str, Any]) -> None:
        r = ev.get("response") or {}
        self.run.counts["terminals"] += 1
        self._same("terminal response id", r.get("id"), self._rid)
        self._same("terminal status", r.get("status"), TERMINAL_STATUS[ev["type"]])
        self._same(
            "terminal output ids", [o.get("id") for o in r.get("output") or []], [i.id for i in self._items]
        )
        usage = r.get("usage") or {}
        if ev["type"] == "response.completed":
            self.run.counts["completed"] += 1
            self._same(
                "usage total_tokens",
                usage.get("total_tokens"),
                (usage.get("input_tokens") or 0) + (usage.get("output_tokens") or 0),
            )
        else:
            self._violate("not_completed", f"{ev['type']}: {r.get('error') or r.get('incomplete_details')}")
        self._end()

    _on_completed = _on_incomplete = _on_failed = _on_terminal
