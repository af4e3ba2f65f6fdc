"""A request's history and input, resolved when it starts (docs/protocol.md §4).

``previous_response_id`` comes from the lanes' cache, else (``store:true`` responses) from
the store; ``item_reference`` items from the conversations this connection holds, else from
the store; every tool output must answer a call the conversation issued; the input is
rendered inline or, when large, by the driver.  Each step returns what comes next
(:data:`Step`): a :class:`~actors.core.turn.Load` or :class:`~actors.core.turn.Render` for
the driver to answer, a :class:`Refused`, or the rendered input, from which the session
makes the model call (:mod:`actors.core.turn_start`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from store import StoredResponse

from ..errors import APIError, InvalidRequest, PreviousResponseNotFound, ServerError
from ..protocol import InputItem, answered_call_id
from ..protocol.wire_types import JSONObject
from . import references
from .context import ContextEntry, count_calls, from_record, in_format
from .lanes import Lanes
from .prepare import Preparer
from .render import MarkedTokens, item_text, render_marked
from .request_queue import Checked, Request, Requests, Stage
from .steering import Steering
from .turn import Load, Render, Turn


@dataclass(frozen=True, slots=True)
class Refused:
    """The request is refused before its ``response.created``; ``evict``: its lane's cached
    parent goes too (a failed same-lane continuation; a failed fork keeps it)."""

    error: APIError
    evict: bool = False


# What a step of the resolution leaves: the driver's answer to wait for, a refusal, or the
# rendered input (the request is ready for its model call).
Step = Load | Render | Refused | MarkedTokens


class History:
    """The resolution of a connection's starting requests; the session owns the parts it
    reads and moves (the lanes, the requests' stages, the steer input waiting)."""

    def __init__(
        self,
        prep: Preparer,
        lanes: Lanes,
        requests: Requests,
        steering: Steering,
        *,
        owner: str,
        perf: Callable[[], float],
        render_offload_chars: int,
    ) -> None:
        self._prep = prep
        self._lanes = lanes
        self._requests = requests
        self._steering = steering
        self._owner = owner
        self._perf = perf
        self._render_offload_chars = render_offload_chars

    def start(self, request: Request) -> Step:
        """Resolve ``previous_response_id`` when the request starts: the lanes' cache first,
        then (``store:true`` responses) the store, else ``previous_response_not_found``."""
        previous = request.create.previous_response_id
        if previous is None:
            return self._begin(request, None)
        cached = self._lanes.find(previous)
        if cached is not None:
            return self._begin(request, cached[1])
        self._requests.move(request, Stage.LOADING)
        request.asked = self._perf()
        return Load(request.id, previous, self._owner)

    def loaded(self, request: Request, record: StoredResponse | None) -> Step:
        """The store's answer to a :class:`Load` (``None``: not found for this owner)."""
        timer = request.timer
        timer.ms["history_load"] += (self._perf() - request.asked) * 1000.0
        if record is None:
            return Refused(PreviousResponseNotFound(request.create.previous_response_id or ""))
        try:
            parent = from_record(
                record, self._prep.new_scan, timer, self._prep.format(request.create.model or "")
            )
        except Exception:  # noqa: BLE001 - a damaged record is a server fault, not the client's
            return Refused(ServerError())
        return self._begin(request, parent)

    def items_loaded(self, request: Request, found: Mapping[str, JSONObject]) -> Step:
        """The store's answer to a :class:`Load` of ``item_ids``: the items it has."""
        assert request.resolving is not None
        request.timer.ms["history_load"] += (self._perf() - request.asked) * 1000.0
        parent, same_lane, steered, here = request.resolving
        request.resolving = None
        return self._resolved(request, parent, same_lane, steered, {**found, **here})

    def rendered(self, request: Request, rendered: MarkedTokens | None) -> Step:
        """The driver's answer to a :class:`Render` (``None``: rendering failed, a server
        fault).  The render phase counts the whole wait, the worker's queue included."""
        request.timer.ms["render"] += (self._perf() - request.asked) * 1000.0
        assert request.checked is not None
        if rendered is None:
            return Refused(ServerError(), evict=request.checked.same_lane)
        return rendered

    def resolve_running(self, items: list[InputItem], turn: Turn) -> list[InputItem]:
        """A running response's new input (append, inject) with its item references resolved
        from the conversations held here (the response's own first); no store lookup: a paused
        response does not wait for the store, so an id not held is :class:`ItemNotFound`."""
        wanted = references.referenced(items)
        if not wanted:
            return items
        own = [turn.rollout.context] if turn.rollout is not None else []
        own += [turn.parent] if turn.parent is not None else []
        return references.resolve(
            items, references.find(wanted, self._conversations(own)), connection_only=True
        )

    def _begin(self, request: Request, parent: ContextEntry | None) -> Step:
        lane_name, create = request.lane, request.create
        same_lane = parent is not None and self._lanes[lane_name].latest is parent
        if parent is not None:
            parent = in_format(parent, self._prep.format(create.model or ""))
        # Steer input queued for this continuation goes first (docs/protocol.md §2.3 (c)).
        steered = self._steering.take_for(create.previous_response_id, lane_name)
        wanted = references.referenced(create.items)
        if not wanted:
            return self._begin_with(request, parent, same_lane, steered + create.items)
        # item_reference: from the conversations this connection holds, else from the store.
        found = references.find(wanted, self._conversations([parent] if parent is not None else []))
        if len(found) < len(set(wanted)):
            request.resolving = (parent, same_lane, steered, found)
            if request.stage is not Stage.LOADING:
                self._requests.move(request, Stage.LOADING)
            request.asked = self._perf()
            missing = tuple(i for i in dict.fromkeys(wanted) if i not in found)
            return Load(request.id, "", self._owner, item_ids=missing)
        return self._resolved(request, parent, same_lane, steered, found)

    def _conversations(self, first: list[ContextEntry]) -> list[list[JSONObject]]:
        """The conversations this connection holds, ``first`` first (where references look)."""
        own = [entry.items for entry in first]
        return own + [lane.latest.items for lane in self._lanes.values() if lane.latest is not None]

    def _resolved(
        self,
        request: Request,
        parent: ContextEntry | None,
        same_lane: bool,
        steered: list[InputItem],
        found: Mapping[str, JSONObject],
    ) -> Step:
        try:
            with request.timer.phase("parse_validate"):
                items = steered + references.resolve(request.create.items, found)
        except APIError as exc:
            return Refused(exc, evict=same_lane)
        return self._begin_with(request, parent, same_lane, items)

    def _begin_with(
        self, request: Request, parent: ContextEntry | None, same_lane: bool, items: list[InputItem]
    ) -> Step:
        """The start of a request whose history is known and whose input is resolved."""
        create, timer = request.create, request.timer
        fmt = self._prep.format(create.model or "")
        try:
            with timer.phase("parse_validate"):
                checked = check_calls(parent, items)
        except APIError as exc:
            return Refused(exc, evict=same_lane)
        request.checked = Checked(parent, items, same_lane, *checked)
        limit = self._render_offload_chars
        if limit and sum(len(item_text(item)) for item in items) >= limit:
            self._requests.move(request, Stage.RENDERING)
            request.asked = self._perf()
            return Render(request.id, tuple(items), fmt)
        with timer.phase("render"):
            return render_marked(items, fmt)


def check_calls(parent: ContextEntry | None, items: Sequence[InputItem]) -> tuple[frozenset[str], int]:
    """Every function or custom tool output with a ``call_id`` must answer a call the
    conversation issued (``protocol.answered_call_id``): the calls issued, and how many tool
    results the context holds."""
    call_ids = set(parent.call_ids) if parent else set()
    results = parent.tool_results if parent else 0
    for i, item in enumerate(items):
        results += count_calls([item], call_ids)
        answered = answered_call_id(item)
        if answered is not None and answered not in call_ids:
            raise InvalidRequest(
                f"No tool call found for {item.type.replace('_', ' ')} with call_id {answered}.",
                param=f"input[{i}].call_id",
            )
    return frozenset(call_ids), results
