"""The session core: one WebSocket connection's state machine, sans-I/O.

One way in: :meth:`Session.handle` takes an input (a frozen record of
:mod:`actors.core.inputs`: a client frame, a loaded history, a rendered input, an inference
chunk, a write done, a drain, an eviction…) and returns the
:class:`~actors.core.turn.Effects` its driver must carry out (server events to send, model
calls to start, records to write); the session never calls its driver.  No Ray, no
asyncio, no I/O: the connection (:mod:`actors.host.connection`) carries the effects out.

The session dispatches and schedules; what a concern keeps lives with it: each request and
its stage in :class:`~actors.core.request_queue.Requests`, the lanes and the conversations they cache in
:class:`~actors.core.lanes.Lanes`, the steer input not delivered yet in
:class:`~actors.core.steering.Steering`, an append-mode rollout in the turn's
:class:`~actors.core.turn.Rollout` (pure functions in :mod:`actors.core.rollout`).

Semantics (docs/protocol.md §4): lanes keyed by ``stream_id`` (``None`` = default lane) run
FIFO within a lane and concurrently across lanes, at most ``max_inflight`` responses at once;
each lane caches its latest response's rendered context; ``previous_response_id`` is resolved
when the request starts; a failed same-lane continuation evicts its parent, a failed fork
does not.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Collection, Mapping, Sequence

from inference.formats import ChatFormat
from inference.types import Done, InferenceEvent, InferenceRequest
from store import StoredResponse, UsageEntry

from ..config import SessionConfig
from ..errors import (
    APIError,
    InvalidRequest,
    PreviousResponseNotFound,
    ServerError,
    ServerShuttingDown,
    UnknownEventType,
)
from ..ids import new_id
from ..protocol import (
    RESPONSE_ERROR_CODES,
    InputItem,
    PromptCacheOptions,
    ResponseAppend,
    ResponseCreate,
    ResponseInject,
    ResponseSteer,
    answered_call_id,
    error_event,
    parse_client_event,
)
from ..protocol.wire_types import JSONObject
from . import compaction, continuity, inject, references, rollout
from . import inputs as ev
from .context import (
    ContextEntry,
    count_calls,
    extend,
    from_record,
    in_format,
    input_dicts,
    prompt_breakpoints,
)
from .lanes import HostBudget, Lanes
from .prepare import Preparer, SharedParts
from .render import MarkedTokens, item_text, render_marked
from .request_queue import Checked, Request, Requests, Stage
from .response_builder import parallel_tool_calls, tool_choice_name
from .steering import (
    SteerError,
    Steering,
    calls_started,
    required_input,
    steer_failed,
    steer_items,
    successor,
)
from .timings import METADATA_KEY, PhaseTimer, Report, as_metadata
from .turn import Effects, Load, NewResponse, Render, Turn

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
    ) -> None:
        self.config = config
        self._check_metadata = check_metadata
        # A model without a format of its own: cl100k.  ``prompt_parts``: the host's
        # renderings of instructions and tools, shared by its connections (actors.core.prompt_parts).
        self._prep = Preparer(models, config.safety, formats, prompt_parts)
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

    def snapshot(self) -> bytes:
        """The resumable state (:mod:`actors.core.continuity`): the lanes' latest responses
        and the steer input waiting."""
        return continuity.snapshot(self._lanes, self._steering)

    def _on_restore(self, raw: bytes) -> Effects:
        """Take a :meth:`snapshot` of another holder of this connection (a resume on any
        node); the conversations are rebuilt from their items."""
        formats = {f.name: f for f in self._prep.formats()}
        return continuity.restore(
            raw,
            self._lanes,
            self._steering,
            new_scan=self._prep.new_scan,
            fmt=lambda name: formats.get(name or "", self._prep.format("")),
            owner=self.owner,
            timer=PhaseTimer(self._perf),
        )

    def _on_release(self) -> Effects:
        """The connection's state is dropped for good: what it cached stops counting
        against the host's budget."""
        self._lanes.release()
        return Effects()

    def _on_frame(self, data: str | bytes, received: float | None = None) -> Effects:
        """One client frame (its first bytes ``received`` at that time on the session's
        ``perf`` clock, if known).  Errors become ``error`` events; the session stays usable."""
        timer = PhaseTimer(self._perf, received)
        try:
            with timer.phase("parse_validate"):
                event = parse_client_event(data)
        except APIError as exc:
            return Effects(events=[error_event(exc)])
        if isinstance(event, ResponseSteer):
            return self._on_steer(event)
        if isinstance(event, ResponseAppend):
            return self._on_append(event)
        if isinstance(event, ResponseInject):
            return self._on_inject(event)
        if not isinstance(event, ResponseCreate):
            return Effects()  # response.processed: nothing to do
        return self._on_create(event, timer)

    def _on_create(self, event: ResponseCreate, timer: PhaseTimer | None = None) -> Effects:
        """A parsed ``response.create`` (the HTTP path enters here, with its own timer)."""
        timer = timer or PhaseTimer(self._perf)
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

    # ------------------------------------------------------------------ steering
    def _on_steer(self, event: ResponseSteer) -> Effects:
        """``response.steer`` (docs/protocol.md §2.3): a running response stops and an
        automatic successor takes the input, unless it has begun a function call; input for a
        response that stopped on function calls waits for the client's next create."""
        target = event.previous_response_id
        try:
            items = steer_items(event)
            turn = self._turn_of(target)
            if turn is not None:
                return self._steer_running(turn, items, event.input)
            events = self._steering.accept_stopped(target, items)
            if events is not None:
                return Effects(events=events)
            done = self._lanes.find(target)
            if done is not None:
                raise SteerError(
                    "response_already_completed", "The response already completed.", stream_id=done[0]
                )
            raise SteerError("response_not_found", f"No response with id '{target}' on this connection.")
        except SteerError as exc:
            return Effects(events=[steer_failed(event, exc)])

    def _steer_running(self, turn: Turn, items: list[InputItem], raw_input: object) -> Effects:
        b = turn.builder
        fx = Effects(events=self._steering.accept_running(turn.lane, b, items, raw_input))
        if calls_started(b):
            return fx  # the input waits for the end of the response (_finish settles it)
        # Stop at this chunk boundary (incomplete, "steered"); settling the response queues
        # its successor first on the lane.
        fx.events += b.cut("steered")
        fx.cancel.append(turn.turn_id)
        turn.timer.inference_done()
        fx += self._finish(turn, failed=False)
        return fx

    def _turn_of(self, response_id: object) -> Turn | None:
        """The running response with this id."""
        request = self._requests.responding(response_id, Stage.RUNNING)
        return request.turn if request is not None else None

    # ------------------------------------------------------------------ append mode
    def _on_append(self, event: ResponseAppend) -> Effects:
        """``response.append``: tool results for a paused response; sampling resumes in it."""
        if not self.append_mode:
            return Effects(
                events=[
                    error_event(UnknownEventType("Unsupported event type 'response.append'.", param="type"))
                ]
            )
        turn = self._turn_of(event.response_id)
        if turn is None or turn.rollout is None or not turn.builder.paused:
            return Effects(
                events=[
                    error_event(
                        InvalidRequest(
                            f"No response '{event.response_id}' is waiting for tool results.",
                            param="response_id",
                        )
                    )
                ]
            )
        try:
            items = self._resolve_from_conversations(event.input, turn)
            results = rollout.tool_results(turn.rollout, items)
            return self._resume_with(turn, results)
        except APIError as exc:
            return Effects(events=[error_event(exc, stream_id=turn.lane)])

    def _resume_with(self, turn: Turn, results: Sequence[rollout.ToolResult]) -> Effects:
        """Sampling resumes in a paused response with these tool results (append, inject)."""
        assert turn.rollout is not None
        scan = self._prep.scan(turn.rollout.context.scan, results)
        turn.rollout = rollout.answer(turn.rollout, results, scan, turn.fmt)
        turn.request = rollout.resume(turn.request, turn.prefix_len, turn.rollout)
        turn.builder.resume()
        return Effects(start=[turn])

    # ------------------------------------------------------------------ response.inject
    def _on_inject(self, event: ResponseInject) -> Effects:
        """``response.inject`` (actors.core.inject): tool output for a running response,
        committed now if it is paused on its calls, else when its model call stops."""
        turn = self._turn_of(event.response_id)
        finished = self._lanes.find(event.response_id) if turn is None else None
        if turn is None or (event.stream_id is not None and event.stream_id != turn.lane):
            return Effects(events=[inject.not_running(event, finished)])
        try:
            items = self._resolve_from_conversations(event.input, turn)
            results = inject.check(turn, event, items, self._injections.pending(event.response_id))
            if not turn.builder.paused:
                self._injections.accept(turn, event, results)
                return Effects()
            fx = self._resume_with(turn, results)
            fx.events.insert(0, inject.created(turn))
            return fx
        except APIError as exc:
            return Effects(events=[error_event(exc, stream_id=turn.lane)])

    # ------------------------------------------------------------------ scheduling
    def _schedule(self) -> Effects:
        """Start queued creates, oldest first, whose lane is idle, up to ``max_inflight``
        (each one started leaves the queue, refused or not)."""
        fx = Effects()
        while (request := self._requests.next_to_start(self.config.max_inflight)) is not None:
            request.timer.restart()
            fx += self._start(request)
        return fx

    def _start(self, request: Request) -> Effects:
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
        return Effects(load=[Load(request.id, previous, self.owner)])

    def _on_loaded(self, load_id: int, record: StoredResponse | None) -> Effects:
        """The store's answer to a :class:`Load` (``None``: not found for this owner)."""
        request = self._requests.at(load_id, Stage.LOADING)
        if request is None:  # the socket went away meanwhile
            return Effects()
        timer = request.timer
        timer.ms["history_load"] += (self._perf() - request.asked) * 1000.0
        if record is None:
            fx = self._reject(request, PreviousResponseNotFound(request.create.previous_response_id or ""))
        else:
            try:
                parent = from_record(
                    record, self._prep.new_scan, timer, self._prep.format(request.create.model or "")
                )
            except Exception:  # noqa: BLE001 - a damaged record is a server fault, not the client's
                fx = self._reject(request, ServerError())
            else:
                fx = self._begin(request, parent)
        fx += self._schedule()
        return fx

    def _reject(self, request: Request, exc: APIError, *, evict: bool = False) -> Effects:
        """The request is refused before its ``response.created``: an ``error`` event."""
        self._requests.drop(request)
        if evict:
            self._lanes.evict(request.lane)
        return Effects(events=[error_event(exc, stream_id=request.lane)])

    def _begin(self, request: Request, parent: ContextEntry | None) -> Effects:
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
            return Effects(load=[Load(request.id, "", self.owner, item_ids=missing)])
        return self._resolved(request, parent, same_lane, steered, found)

    def _conversations(self, first: list[ContextEntry]) -> list[list[JSONObject]]:
        """The conversations this connection holds, ``first`` first (where references look)."""
        held = [entry.items for entry in first]
        return held + [lane.latest.items for lane in self._lanes.values() if lane.latest is not None]

    def _resolve_from_conversations(self, items: list[InputItem], turn: Turn) -> list[InputItem]:
        """A running response's new input (append, inject) with its item references resolved
        from the conversations held here (the response's own first); no store lookup: a paused
        response does not wait for the store, so an id not held is :class:`ItemNotFound`."""
        wanted = references.referenced(items)
        if not wanted:
            return items
        own = [turn.rollout.context] if turn.rollout is not None else []
        own += [turn.parent] if turn.parent is not None else []
        return references.resolve(items, references.find(wanted, self._conversations(own)), held_only=True)

    def _on_items_loaded(self, load_id: int, found: Mapping[str, JSONObject]) -> Effects:
        """The store's answer to a :class:`Load` of ``item_ids``: the items it has."""
        request = self._requests.at(load_id, Stage.LOADING)
        if request is None or request.resolving is None:  # the socket went away meanwhile
            return Effects()
        request.timer.ms["history_load"] += (self._perf() - request.asked) * 1000.0
        parent, same_lane, steered, held = request.resolving
        request.resolving = None
        fx = self._resolved(request, parent, same_lane, steered, {**found, **held})
        fx += self._schedule()
        return fx

    def _resolved(
        self,
        request: Request,
        parent: ContextEntry | None,
        same_lane: bool,
        steered: list[InputItem],
        found: Mapping[str, JSONObject],
    ) -> Effects:
        try:
            with request.timer.phase("parse_validate"):
                items = steered + references.resolve(request.create.items, found)
        except APIError as exc:
            return self._reject(request, exc, evict=same_lane)
        return self._begin_with(request, parent, same_lane, items)

    def _begin_with(
        self, request: Request, parent: ContextEntry | None, same_lane: bool, items: list[InputItem]
    ) -> Effects:
        """The start of a request whose history is known and whose input is resolved."""
        create, timer = request.create, request.timer
        fmt = self._prep.format(create.model or "")
        try:
            with timer.phase("parse_validate"):
                checked = self._check_calls(parent, items)
        except APIError as exc:
            return self._reject(request, exc, evict=same_lane)
        request.checked = Checked(parent, items, same_lane, *checked)
        limit = self.config.render_offload_chars
        if limit and sum(len(item_text(item)) for item in items) >= limit:
            self._requests.move(request, Stage.RENDERING)
            request.asked = self._perf()
            return Effects(render=[Render(request.id, tuple(items), fmt)])
        with timer.phase("render"):
            rendered = render_marked(items, fmt)
        return self._prepare(request, rendered)

    def _on_rendered(self, render_id: int, rendered: MarkedTokens | None) -> Effects:
        """The driver's answer to a :class:`Render` (``None``: rendering failed, a server
        fault).  The render phase counts the whole wait, the worker's queue included."""
        request = self._requests.at(render_id, Stage.RENDERING)
        if request is None:  # the socket went away meanwhile
            return Effects()
        request.timer.ms["render"] += (self._perf() - request.asked) * 1000.0
        assert request.checked is not None
        if rendered is None:
            fx = self._reject(request, ServerError(), evict=request.checked.same_lane)
        else:
            fx = self._prepare(request, rendered)
        fx += self._schedule()
        return fx

    def _prepare(self, request: Request, rendered: MarkedTokens) -> Effects:
        """The rest of a request's preparation once its input is rendered; it starts."""
        input_tokens = rendered.tokens
        begun = request.checked
        assert begun is not None
        lane_name, create, timer = request.lane, request.create, request.timer
        parent, items = begun.parent, begun.items
        fmt = self._prep.format(create.model or "")
        try:
            with timer.phase("render"):
                tools = self._prep.tools(create.tools or (), fmt)
                prompt = array("I", tools.tokens)
                prompt.extend(self._prep.instructions(create.instructions, fmt))
                # Server-side compaction (actors.core.compaction): the parent, compacted.
                whole = len(prompt) + (len(parent.tokens) if parent else 0) + len(input_tokens)
                compacted = compaction.compacted(create, whole, parent, fmt, self.config.max_input_tokens)
                if compacted is not None:
                    parent = compacted.parent
                if parent is not None:
                    prompt.extend(parent.tokens)
                prompt.extend(input_tokens)
            if len(prompt) > self.config.max_input_tokens:
                raise InvalidRequest(
                    f"The input has {len(prompt)} tokens; the limit is {self.config.max_input_tokens}.",
                    param="input",
                    code="context_length_exceeded",
                )
            with timer.phase("classify"):
                scan = self._prep.scan(parent.scan if parent is not None else None, items)
        except APIError as exc:
            return self._reject(request, exc, evict=begun.same_lane)

        store = True if create.store is None else create.store
        caching = create.prompt_cache_options or PromptCacheOptions()
        generate = create.generate is not False and not caching.prewarm
        prefix_len = len(prompt) - len(input_tokens) - (len(parent.tokens) if parent else 0)
        call = InferenceRequest(
            request_id=new_id("resp"),  # the response's id
            model=create.model or "",
            prompt_token_ids=prompt,
            tools=tools.specs,
            tool_choice=tool_choice_name(create.tool_choice),
            parallel_tool_calls=parallel_tool_calls(create),
            tool_results_in_context=begun.tool_results,
            max_output_tokens=create.max_output_tokens,
            generate=generate,
            session_key=self.session_key,
            # One prefix-cache scope per API key, shared by its sockets and HTTP requests
            # and never by another key's (docs/protocol.md check 27).
            cache_scope=f"key:{self.owner}",
            prompt_cache_key=create.prompt_cache_key,
            replica_hint=(parent.replica or None) if parent is not None else None,
            metadata=tuple(sorted((create.metadata or {}).items())),
            cache_mode=caching.mode,
            cache_ttl=caching.ttl,
            breakpoints=prompt_breakpoints(prefix_len, parent, rendered.marks),
        )
        timer.wait_inference()
        # The call is ready: the response and its first events are made once the driver
        # has started it (CallsStarted).
        turn = Turn(
            turn_id=request.id,
            lane=lane_name,
            request=call,
            response_from=NewResponse(
                create,
                store,
                tools.echoed,
                self._clock,
                output_scan=self._prep.new_scan() if self.config.safety.enabled else None,
                pause_on_calls=self.append_mode or inject.waits_for_tools(create, self.transport),
                first_item=compacted.item if compacted is not None else None,
            ),
            parent=parent,
            same_lane_parent=begun.same_lane,
            inputs=input_dicts(items),
            input_tokens=input_tokens,
            input_marks=rendered.marks,
            call_ids=begun.call_ids,
            store=store,
            scan=scan,
            timer=timer,
            timings_requested=(create.metadata or {}).get(METADATA_KEY) == "1",
            create=create,
            prefix_len=prefix_len,
            fmt=fmt,
        )
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

    def _check_calls(
        self, parent: ContextEntry | None, items: Sequence[InputItem]
    ) -> tuple[frozenset[str], int]:
        """Every function or custom tool output with a ``call_id`` must answer a call the
        conversation issued (``protocol.answered_call_id``)."""
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

    # ------------------------------------------------------------------ inference side
    def _on_inference(self, turn_id: int, chunk: Sequence[InferenceEvent]) -> Effects:
        """A chunk of model output for a started turn."""
        turn = self._running(turn_id)
        if turn is None:
            return Effects()
        fx = Effects(events=turn.builder.feed(chunk))
        if turn.builder.paused:  # append mode: the call's output joins the rollout
            turn.rollout = rollout.fold(turn.rollout or rollout.begin(turn), turn.builder.output, turn.fmt)
            injected = self._injections.commit(turn.builder.response.id)
            if injected:  # held while the call ran (actors.core.inject): committed now
                try:
                    fx += self._resume_with(turn, injected)
                    fx.events.append(inject.created(turn))
                except APIError as exc:
                    fx.events.append(error_event(exc, stream_id=turn.lane))
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
        lane continues from it any more."""
        cached = None if stored else self._lanes.find(response_id)
        if cached is not None:
            self._lanes.evict(cached[0])  # and what it cached stops counting against the budget
        request = self._requests.responding(response_id, Stage.FINISHING)
        if request is None:
            return Effects()  # dropped meanwhile (the socket went away)
        self._requests.drop(request)
        return self._schedule()

    def _on_inference_error(self, turn_id: int, exc: BaseException) -> Effects:
        """The model call failed after ``response.created``: ``response.failed``."""
        turn = self._running(turn_id)
        if turn is None:
            return Effects()
        code = getattr(exc, "code", None)
        fail = {"code": code if code in RESPONSE_ERROR_CODES else "server_error"}
        message = getattr(exc, "public_message", None)  # a scripted scenario's error (inference.scenario)
        if isinstance(message, str) and code in RESPONSE_ERROR_CODES:
            fail["message"] = message
        fx = Effects(events=turn.builder.fail(**fail))
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
            b, timer = turn.builder, turn.timer
            response = b.response
            with timer.phase("post"):
                if turn.rollout is not None:  # an append-mode rollout: one response, many calls
                    turn.rollout = rollout.fold(turn.rollout, response.output, turn.fmt)
                    entry = turn.rollout.context
                else:
                    entry = extend(
                        turn.parent,
                        response.id,
                        input_tokens=turn.input_tokens,
                        inputs=turn.inputs,
                        output=response.output,
                        call_ids=turn.call_ids,
                        tool_results=turn.request.tool_results_in_context,
                        store=turn.store,
                        scan=turn.scan,
                        fmt=turn.fmt,
                        output_tokens=b.context_tokens,
                        input_marks=turn.input_marks,
                    )
                entry.replica = b.replica
                fx.evict += self._lanes.remember(turn.lane, entry)
                fx.usage.append(self._usage(turn))
            report = Report.at_finish(
                response.id, timer, (b.queue_ms, b.prefill_ms, b.decode_ms), final=turn.store
            )
            fx.timings.append(report)
            terminal = b.terminal(as_metadata(report.ms) if turn.timings_requested else None)
            if turn.timings_requested:  # taken again as the sender encodes it (actors.core.timings)
                report.into = terminal.response.metadata
            fx.events.append(terminal)
            if turn.store:  # the record is the response as sent, terminal metadata included
                fx.persist.append(
                    StoredResponse(
                        id=response.id,
                        owner=self.owner,
                        created_at=self._clock(),
                        response=response.model_dump(mode="json"),
                        input_items=turn.inputs,
                        context=entry.items,
                    )
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
                PhaseTimer(self._perf),
                first=True,
            )
        fx += self._schedule()
        return fx

    def _usage(self, turn: Turn) -> UsageEntry:
        r = turn.builder.response
        assert r.usage is not None
        return UsageEntry(
            response_id=r.id,
            owner=self.owner,
            model=r.model,
            transport=self.transport,  # type: ignore[arg-type]
            input_tokens=r.usage.input_tokens,
            cached_tokens=r.usage.input_tokens_details.cached_tokens,
            output_tokens=r.usage.output_tokens,
            created_at=self._clock(),
        )
