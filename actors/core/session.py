"""The session core: one WebSocket connection's state machine, sans-I/O.

One way in: :meth:`Session.handle` takes an input (a frozen record of
:mod:`actors.core.inputs`: a client frame, a loaded history, a rendered input, an inference
chunk, a write done, a drain, an eviction…) and returns the
:class:`~actors.core.turn.Effects` its driver must carry out (server events to send, model
calls to start, records to write); the session never calls its driver.  The
connection (:mod:`actors.host.connection`) carries the effects out.

The session dispatches, schedules and decides when a response ends; each job lives in a
module of its own: a starting request's history and input in :mod:`actors.core.history`, its
model call and turn in :mod:`actors.core.turn_start`, client input for a running response
(steer, append, inject) in :mod:`actors.core.running_input`, what a finished turn leaves
(context entry, ledger line, terminal event, record) in :mod:`actors.core.finish`.  What a
concern keeps lives with it: each request and its stage in
:class:`~actors.core.request_queue.Requests`, the lanes and the conversations they cache in
:class:`~actors.core.lanes.Lanes`, the steer input not delivered yet in
:class:`~actors.core.steering.Steering`, an append-mode rollout in the turn's
:class:`~actors.core.turn.Rollout` (pure functions in :mod:`actors.core.rollout`).

Semantics (docs/protocol.md §4): lanes keyed by ``stream_id`` (``None`` = default lane) run
FIFO within a lane and concurrently across lanes, at most ``max_inflight`` responses at once;
each lane caches its latest response's rendered context; ``previous_response_id`` is resolved
when the request starts; a failed same-lane continuation evicts its parent, a failed fork
does not.

Over 400 lines on purpose: every input's handler, and the scheduling they end in, reads here
in one place, so the order of a response's effects is seen without leaving the file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence

from inference.formats import ChatFormat
from inference.types import Done, InferenceEvent
from store import StoredResponse, UsageEntry

from ..config import SessionConfig
from ..errors import APIError, InvalidRequest, ServerShuttingDown
from ..protocol import (
    ResponseAppend,
    ResponseCreate,
    ResponseInject,
    ResponseSteer,
    error_event,
    parse_client_event,
)
from ..protocol.wire_types import JSONObject
from . import finish, inject, resumable
from . import inputs as ev
from .context import ContextEntry
from .history import History, Refused, Step
from .lanes import HostBudget, Lanes
from .prepare import Preparer, SharedParts
from .render import MarkedTokens
from .request_queue import Request, Requests, Stage
from .running_input import RunningInput
from .steering import Steering, required_input, successor
from .timings import PhaseTimer
from .turn import Effects, Load, Render, Turn
from .turn_start import TurnStart

__all__ = ["CheckMetadata", "Effects", "Load", "Render", "Session", "Turn"]

# The backend's check of a create's ``metadata`` (its own knobs, such as the emulator's
# ``emulator.*``): raises an :class:`~actors.errors.APIError` for a value it cannot take
# (:meth:`actors.backend.InferenceClient.check_metadata`).
CheckMetadata = Callable[[Mapping[str, str]], None]


def _no_check(metadata: Mapping[str, str]) -> None:
    pass


class Session:
    def __init__(
        self,
        config: SessionConfig,
        models: Collection[str],
        *,
        session_key: str | None,
        owner: str = "",
        transport: str = "websocket",
        append_mode: bool = False,
        clock: Callable[[], float],
        perf: Callable[[], float] = time.perf_counter,
        cache: HostBudget | None = None,
        formats: Mapping[str, ChatFormat] | None = None,
        check_metadata: CheckMetadata = _no_check,
        prompt_parts: SharedParts | None = None,
        loop_lag: Callable[[float], float] | None = None,
    ) -> None:
        """``loop_lag``: the host's event-loop stall since a time on ``perf``'s clock
        (:mod:`actors.core.loop_lag`), each response's ``loop_lag`` timing; none: not reported."""
        self.config = config
        self._loop_lag = loop_lag
        self._check_metadata = check_metadata
        # A model without a format of its own: cl100k.  ``prompt_parts``: the host's
        # renderings of instructions and tools, shared by its connections (actors.core.prompt_parts).
        self._prep = Preparer(models, config.safety, formats, prompt_parts)
        self._recurring = prompt_parts.recurring if prompt_parts is not None else None
        self._perf = perf
        self.session_key = session_key
        self.owner = owner
        self.transport = transport
        self._clock = clock
        self._lanes = Lanes(
            self, max_named=config.max_named_lanes, max_cached_tokens=config.max_cached_tokens, budget=cache
        )
        self._requests = Requests()
        self._steering = Steering()
        self._injections = inject.Injections()
        self.append_mode = append_mode
        self._draining = False  # shutting down: no new responses
        self._history = History(
            self._prep,
            self._lanes,
            self._requests,
            self._steering,
            owner=owner,
            perf=perf,
            render_offload_chars=config.render_offload_chars,
        )
        self._running_input = RunningInput(
            self._prep,
            self._lanes,
            self._requests,
            self._steering,
            self._injections,
            self._history,
            append_mode=append_mode,
        )
        self._turns = TurnStart(self._prep, config, session_key, owner, transport, append_mode, clock)

    def handle(self, event: ev.Input) -> Effects:
        """The one way in: what the driver must do in answer to ``event``."""
        match event:
            case ev.ClientFrame():
                return self._on_frame(event.data, event.received)
            case ev.ParsedCreate():
                return self._on_create(event.create, event.timer)
            case ev.CallsStarted():
                return self._on_calls_started(event.turn_ids)
            case ev.InferenceChunk():
                return self._on_inference(event.turn_id, event.chunk)
            case ev.InferenceFailed():
                return self._on_inference_error(event.turn_id, event.error)
            case ev.HistoryLoaded():
                return self._on_loaded(event.load_id, event.record)
            case ev.ItemsLoaded():
                return self._on_items_loaded(event.load_id, event.found)
            case ev.Rendered():
                return self._on_rendered(event.render_id, event.rendered)
            case ev.Written():
                return self._on_written(event.response_id, stored=event.stored)
            case ev.DrainStarted():
                return self._on_drain()
            case ev.Disconnected():
                return self._on_disconnect()
            case ev.StateRestored():
                return self._on_restore(event.raw)
            case ev.LaneEvicted():
                self._lanes.evicted(event.lane, event.response_id)
                return Effects()
            case ev.Released():
                return self._on_release()
        raise TypeError(f"not a session input: {event!r}")  # pragma: no cover - the union is closed

    # ------------------------------------------------------------------ client side
    @property
    def inflight(self) -> int:
        return self._requests.in_flight

    @property
    def idle(self) -> bool:
        return not self._requests

    @property
    def draining(self) -> bool:
        return self._draining

    def _on_drain(self) -> Effects:
        """The host is shutting down: later creates are refused (``server_shutting_down``);
        the responses in flight and queued carry on.  Once :attr:`idle`, the driver ends the
        connection."""
        self._draining = True
        return Effects()

    def _on_disconnect(self) -> Effects:
        """The socket is gone (its driver cancelled the model calls): every request, at
        whatever stage, is dropped; each lane keeps its latest finished response, so a
        resumed connection continues from there (actors.host.resume)."""
        self._requests.clear()
        self._steering.drop_running()
        self._injections.clear()
        return Effects()

    def cached(self, lane: str | None = None) -> ContextEntry | None:
        """The conversation ``lane`` continues from: its latest response as the session
        caches it (``None``: none yet, evicted, or no such lane)."""
        return self._lanes[lane].latest if lane in self._lanes else None

    def snapshot(self) -> bytes:
        """The resumable state (:mod:`actors.core.resumable`): the lanes' latest responses
        and the steer input waiting."""
        return resumable.snapshot(self._lanes, self._steering)

    def _on_restore(self, raw: bytes) -> Effects:
        """Take a :meth:`snapshot` of another holder of this connection (a resume on any
        node); the conversations are rebuilt from their items."""
        formats = {f.name: f for f in self._prep.formats()}
        return resumable.restore(
            raw,
            self._lanes,
            self._steering,
            new_scan=self._prep.new_scan,
            fmt=lambda name: formats.get(name or "", self._prep.format("")),
            owner=self.owner,
            timer=PhaseTimer(self._perf, lag=self._loop_lag),
        )

    def _on_release(self) -> Effects:
        """The connection's state is dropped for good: what it cached stops counting
        against the host's budget."""
        self._lanes.release()
        return Effects()

    def _on_frame(self, data: str | bytes, received: float | None = None) -> Effects:
        """One client frame (its first bytes ``received`` at that time on the session's
        ``perf`` clock, if known).  Errors become ``error`` events; the session stays usable."""
        timer = PhaseTimer(self._perf, received, self._loop_lag)
        try:
            with timer.phase("parse_validate"):
                event = parse_client_event(data, self._recurring)
        except APIError as exc:
            return Effects(events=[error_event(exc)])
        if isinstance(event, ResponseSteer):
            return self._on_steer(event)
        if isinstance(event, ResponseAppend):
            return self._running_input.append(event)
        if isinstance(event, ResponseInject):
            return self._running_input.inject(event)
        if not isinstance(event, ResponseCreate):
            return Effects()  # response.processed: nothing to do
        return self._on_create(event, timer)

    def _on_create(self, event: ResponseCreate, timer: PhaseTimer | None = None) -> Effects:
        """A parsed ``response.create`` (the HTTP path enters here, with its own timer)."""
        timer = timer or PhaseTimer(self._perf, lag=self._loop_lag)
        lane = event.stream_id
        if self._draining:
            return Effects(events=[error_event(ServerShuttingDown(), stream_id=lane)])
        try:
            with timer.phase("model_resolution"):
                event.model = self._prep.resolve_model(event.model)
            with timer.phase("parse_validate"):
                self._admit(event)
        except APIError as exc:
            # An invalid stream_id is never echoed; a rejected new lane is (docs/protocol.md §5.2).
            return Effects(events=[error_event(exc, stream_id=lane)])
        self._lanes.open(lane)
        self._requests.add(lane, event, timer)
        return self._schedule()

    def _admit(self, create: ResponseCreate) -> None:
        """Checks that need no history: they fail before anything is queued."""
        if create.background:
            raise InvalidRequest("Background mode is not supported by this server.", param="background")
        if self.config.strict_params and create.model_extra:
            name = next(iter(create.model_extra))
            raise InvalidRequest(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
        if create.metadata:
            self._check_metadata(create.metadata)  # the backend's own knobs (InvalidRequest)
        # tool_choice naming an unknown function is refused by the parser (ResponseCreate).
        self._lanes.admit(create.stream_id)

    # ------------------------------------------------------------------ input for a running response
    def _on_steer(self, event: ResponseSteer) -> Effects:
        """``response.steer`` (actors.core.running_input); a response it stops is finished here."""
        fx, stopped = self._running_input.steer(event)
        if stopped is not None:
            fx += self._finish(stopped, failed=False)
        return fx

    # ------------------------------------------------------------------ scheduling
    def _schedule(self) -> Effects:
        """Start queued creates, oldest first, whose lane is idle, up to ``max_inflight``
        (each one started leaves the queue, refused or not)."""
        fx = Effects()
        while (request := self._requests.next_to_start(self.config.max_inflight)) is not None:
            request.timer.restart()
            fx += self._step(request, self._history.start(request))
        return fx

    def _step(self, request: Request, step: Step) -> Effects:
        """What the session does with a step of a request's resolution (actors.core.history)."""
        if isinstance(step, Load):
            return Effects(load=[step])
        if isinstance(step, Render):
            return Effects(render=[step])
        if isinstance(step, Refused):
            return self._reject(request, step.error, evict=step.evict)
        return self._prepare(request, step)

    def _on_loaded(self, load_id: int, record: StoredResponse | None) -> Effects:
        """The store's answer to a :class:`Load` (``None``: not found for this owner)."""
        request = self._requests.at(load_id, Stage.LOADING)
        if request is None:  # the socket went away meanwhile
            return Effects()
        fx = self._step(request, self._history.loaded(request, record))
        fx += self._schedule()
        return fx

    def _on_items_loaded(self, load_id: int, found: Mapping[str, JSONObject]) -> Effects:
        """The store's answer to a :class:`Load` of ``item_ids``: the items it has."""
        request = self._requests.at(load_id, Stage.LOADING)
        if request is None or request.resolving is None:  # the socket went away meanwhile
            return Effects()
        fx = self._step(request, self._history.items_loaded(request, found))
        fx += self._schedule()
        return fx

    def _on_rendered(self, render_id: int, rendered: MarkedTokens | None) -> Effects:
        """The driver's answer to a :class:`Render` (``None``: rendering failed)."""
        request = self._requests.at(render_id, Stage.RENDERING)
        if request is None:  # the socket went away meanwhile
            return Effects()
        fx = self._step(request, self._history.rendered(request, rendered))
        fx += self._schedule()
        return fx

    def _reject(self, request: Request, exc: APIError, *, evict: bool = False) -> Effects:
        """The request is refused before its ``response.created``: an ``error`` event."""
        self._requests.drop(request)
        if evict:
            self._lanes.evict(request.lane)
        return Effects(events=[error_event(exc, stream_id=request.lane)])

    def _prepare(self, request: Request, rendered: MarkedTokens) -> Effects:
        """The request's history is known and its input rendered: its model call starts."""
        try:
            turn = self._turns.turn(request, rendered)
        except APIError as exc:
            assert request.checked is not None
            return self._reject(request, exc, evict=request.checked.same_lane)
        self._requests.move(request, Stage.RUNNING)
        request.turn = turn
        return Effects(start=[turn])

    def _on_calls_started(self, turn_ids: Sequence[int]) -> Effects:
        """The model calls of ``turn_ids`` have left: their responses' first events, in
        the order the calls were started (a turn resumed in append mode has them already)."""
        fx = Effects()
        for turn_id in turn_ids:
            turn = self._running(turn_id)
            if turn is not None and not turn.opened:
                fx.events += turn.open()
        return fx

    # ------------------------------------------------------------------ inference side
    def _on_inference(self, turn_id: int, chunk: Sequence[InferenceEvent]) -> Effects:
        """A chunk of model output for a started turn."""
        turn = self._running(turn_id)
        if turn is None:
            return Effects()
        fx = Effects(events=turn.builder.feed(chunk))
        if turn.builder.paused:  # append mode: the call's output joins the rollout
            fx += self._running_input.paused(turn)  # tool output injected meanwhile is committed
        elif turn.builder.finishing:
            turn.timer.inference_done()
            if not any(isinstance(ev, Done) for ev in chunk):
                fx.cancel.append(turn.turn_id)  # cut by the output classifier
            fx += self._finish(turn, failed=False)
        return fx

    def _on_written(self, response_id: str, *, stored: bool) -> Effects:
        """The write of ``response_id``'s record and ledger line (or its line alone) returned,
        and its terminal event is sent: the response is no longer in flight.  If the write
        failed (``stored`` is false), the client is told the response failed, unbilled: no
        lane continues from it, and its lane is as it was before it (the request sent again
        continues from the same response)."""
        cached = None if stored else self._lanes.find(response_id)
        request = self._requests.responding(response_id, Stage.FINISHING)
        fx = Effects()
        if cached is not None:
            before = request.replaced if request is not None else None
            if before is not None:
                fx.evict += self._lanes.remember(cached[0], before)
            else:
                self._lanes.evict(cached[0])  # and what it cached stops counting against the budget
        if request is None:
            return fx  # dropped meanwhile (the socket went away)
        self._requests.drop(request)
        fx += self._schedule()
        return fx

    def _on_inference_error(self, turn_id: int, exc: BaseException) -> Effects:
        """The model call failed after ``response.created``: ``response.failed``."""
        turn = self._running(turn_id)
        if turn is None:
            return Effects()
        fx = Effects(events=turn.builder.fail(**finish.failure(exc)))
        fx += self._finish(turn, failed=True)
        return fx

    def _running(self, turn_id: int) -> Turn | None:
        request = self._requests.at(turn_id, Stage.RUNNING)
        return request.turn if request is not None else None

    def _finish(self, turn: Turn, *, failed: bool) -> Effects:
        """The response is over: its terminal event, its record and ledger line.  A response
        whose terminal event reports usage (every one but a failure before inference ran)
        stays in flight until its line is written, with its record if stored (:class:`~actors.core.inputs.Written`)."""
        request = self._requests.at(turn.turn_id, Stage.RUNNING)
        assert request is not None
        fx = Effects()
        if failed:
            if turn.same_lane_parent:
                self._lanes.evict(turn.lane)
            if turn.builder.response.usage is not None:  # inference ran: the tokens are billed
                fx.usage.append(self._usage(turn))
        else:
            with turn.timer.phase("post"):
                entry = finish.context_entry(turn)
                request.replaced = self._lanes[turn.lane].latest
                fx.evict += self._lanes.remember(turn.lane, entry)
                fx.usage.append(self._usage(turn))
            report, terminal = finish.terminal(turn)
            fx.timings.append(report)
            fx.events.append(terminal)
            if turn.store:  # the record is the response as sent, terminal metadata included
                fx.persist.append(
                    finish.stored_record(turn, entry, owner=self.owner, created_at=self._clock())
                )
        if fx.usage:  # in flight until the line (and record) is written and the terminal event sent
            self._requests.move(request, Stage.FINISHING)
        else:
            self._requests.drop(request)
        events, steer_input = self._steering.settle(turn.lane, turn.builder, required_input(turn))
        fx.events += events
        fx.events += self._injections.settle(turn.builder.response.id)
        if steer_input:  # an automatic successor, first on the lane (docs/protocol.md §2.3 (a), (b))
            self._requests.add(
                turn.lane,
                successor(turn.create, turn.builder.response.id, steer_input),
                PhaseTimer(self._perf, lag=self._loop_lag),
                first=True,
            )
        fx += self._schedule()
        return fx

    def _usage(self, turn: Turn) -> UsageEntry:
        return finish.usage_line(turn, owner=self.owner, transport=self.transport, created_at=self._clock())
