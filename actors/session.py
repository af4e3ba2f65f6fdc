"""The session core: one WebSocket connection's state machine, sans-I/O.

Events in (client frames, inference chunks), events out (server events to send, model
calls to start).  No Ray, no asyncio: the actor pumps bytes and calls (design.md §6.1).

Semantics (spec §4): lanes keyed by ``stream_id`` (``None`` = default lane) run FIFO within
a lane and concurrently across lanes, at most ``max_inflight`` responses at once; each lane
caches its latest response's rendered context; ``previous_response_id`` is resolved when the
request starts; a failed same-lane continuation evicts its parent, a failed fork does not.
"""

from __future__ import annotations

import itertools
import time
from array import array
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from inference import chat_format
from inference.policy import METADATA_KEYS
from inference.types import Done, InferenceEvent, InferenceRequest

from .config import SessionConfig
from .prepare import Preparer
from .context import ContextEntry, count_calls, extend, from_record, input_dicts
from .errors import (
    APIError,
    InvalidRequest,
    PreviousResponseNotFound,
    ServerError,
    StreamLimitReached,
    UnknownEventType,
)
from .ids import new_id
from .protocol import (
    output_as_input,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    ResponseCreate,
    ResponseObject,
    RESPONSE_ERROR_CODES,
    OutputFunctionCall,
    RequiredInput,
    ResponseAppend,
    ResponseSteer,
    ServerEvent,
    SteerAccepted,
    SteerFailed,
    SteerFailedError,
    SteerPending,
    SteerRef,
    error_event,
    parse_client_event,
)
from .render import item_text, render_items
from .response_builder import ResponseBuilder
from .safety import Classifier
from .steering import MAX_PENDING_STEERS, SteerError, steer_items, successor
from .store import StoredResponse, UsageEntry
from .timings import METADATA_KEY, PhaseTimer, as_metadata


@dataclass(slots=True)
class Turn:
    """A started response: the model call to run and the builder of its events."""

    turn_id: int
    lane: str | None
    request: InferenceRequest
    builder: ResponseBuilder
    parent: ContextEntry | None
    same_lane_parent: bool
    inputs: list[dict]  # the input items as stored (with ids)
    input_tokens: list[int]
    call_ids: frozenset[str]
    store: bool
    scan: Classifier  # the conversation's classifier state including this input
    timer: PhaseTimer
    timings_requested: bool
    create: ResponseCreate  # what a steered response's successor inherits
    # Append mode: the conversation so far inside this one response (tokens and items).
    prefix_len: int = 0  # prompt tokens before the conversation (tools, instructions)
    convo: tuple[array, list[dict]] | None = None
    open_calls: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Waiting:
    """A response that stopped on function calls; steer input waits for the client's next
    create on the lane (spec §2.3 (c))."""

    lane: str | None
    builder: ResponseBuilder
    calls: list[RequiredInput]
    items: list[InputItem] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Load:
    """Fetch a stored response the connection's cache does not hold (spec §4.3)."""

    load_id: int
    response_id: str
    owner: str


@dataclass(slots=True)
class Effects:
    """What the driver must do: send these events, start these model calls, load these
    stored responses, and (off the critical path) persist these records and ledger lines."""

    events: list[ServerEvent] = field(default_factory=list)
    start: list[Turn] = field(default_factory=list)
    load: list[Load] = field(default_factory=list)
    persist: list[StoredResponse] = field(default_factory=list)
    usage: list[UsageEntry] = field(default_factory=list)
    cancel: list[int] = field(default_factory=list)  # turns whose model call must stop
    timings: list[dict[str, float]] = field(default_factory=list)  # per finished response

    def __iadd__(self, other: Effects) -> Effects:
        self.events += other.events
        self.start += other.start
        self.load += other.load
        self.persist += other.persist
        self.usage += other.usage
        self.cancel += other.cancel
        self.timings += other.timings
        return self


@dataclass(slots=True)
class _Lane:
    latest: ContextEntry | None = None
    busy: bool = False  # a response is loading its parent or running


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
    ) -> None:
        self.config = config
        self._prep = Preparer(models, config.safety)
        self._perf = perf
        self.session_key = session_key
        self.owner = owner
        self.transport = transport
        self._clock = clock
        self._lanes: dict[str | None, _Lane] = {None: _Lane()}
        self._pending: deque[tuple[str | None, ResponseCreate, PhaseTimer]] = deque()
        self._turns: dict[int, Turn] = {}
        self._loading: dict[int, tuple[str | None, ResponseCreate, PhaseTimer, float]] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._lru: list[_Lane] = []  # lanes by last update, for the cache bound
        self.append_mode = append_mode
        self._ids = itertools.count()

    # ------------------------------------------------------------------ client side
    @property
    def inflight(self) -> int:
        return len(self._turns) + len(self._loading)

    def on_frame(self, data: str | bytes) -> Effects:
        """One client frame.  Errors become ``error`` events; the session stays usable."""
        timer = PhaseTimer(self._perf)
        try:
            with timer.phase("parse_validate"):
                event = parse_client_event(data)
        except APIError as exc:
            return Effects(events=[error_event(exc)])
        if isinstance(event, ResponseSteer):
            return self._on_steer(event)
        if isinstance(event, ResponseAppend):
            return self._on_append(event)
        if not isinstance(event, ResponseCreate):
            return Effects()  # response.processed: nothing to do
        return self.on_create(event, timer)

    def on_create(self, event: ResponseCreate, timer: PhaseTimer | None = None) -> Effects:
        """A parsed ``response.create`` (the HTTP path enters here, with its own timer)."""
        timer = timer or PhaseTimer(self._perf)
        lane = event.stream_id
        try:
            with timer.phase("model_resolution"):
                event.model = self._prep.resolve_model(event.model)
            with timer.phase("parse_validate"):
                self._admit(event)
        except APIError as exc:
            # An invalid stream_id is never echoed; a rejected new lane is (spec §5.2).
            return Effects(events=[error_event(exc, stream_id=lane)])
        self._lanes.setdefault(lane, _Lane())
        self._pending.append((lane, event, timer))
        return self._schedule()

    def _admit(self, create: ResponseCreate) -> None:
        """Checks that need no history: they fail before anything is queued."""
        if create.background:
            raise InvalidRequest("Background mode is not supported by this server.", param="background")
        if self.config.strict_params and create.model_extra:
            name = next(iter(create.model_extra))
            raise InvalidRequest(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
        for key, value in (create.metadata or {}).items():
            if key in METADATA_KEYS and not value.strip().isdigit():
                raise InvalidRequest(f"Invalid value for metadata key '{key}': expected a whole number.",
                                     param=f"metadata.{key}")
        choice = create.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function" and \
                choice.get("name") not in {t.name for t in create.function_tools}:
            raise InvalidRequest("tool_choice names a function that is not among the tools.",
                                 param="tool_choice")
        named = len(self._lanes) - 1
        if create.stream_id is not None and create.stream_id not in self._lanes and named >= self.config.max_named_lanes:
            raise StreamLimitReached(self.config.max_named_lanes)

    # ------------------------------------------------------------------ steering
    def _on_steer(self, event: ResponseSteer) -> Effects:
        """``response.steer`` (spec §2.3): stop an active response and start a successor with
        the input, or queue the input for the client's next create after function calls."""
        target = event.previous_response_id
        lane: str | None = None
        try:
            items = steer_items(event)
            turn = next((t for t in self._turns.values() if t.builder.response.id == target), None)
            if turn is not None:
                return self._steer_active(turn, items)
            waiting = self._waiting.get(target)
            if waiting is not None:
                lane = waiting.lane
                if len(waiting.items) + len(items) > MAX_PENDING_STEERS:
                    raise SteerError("too_many_pending_steers", "Too much steering input is pending.")
                waiting.items += items
                ref = SteerRef(id=new_id("steer"), previous_response_id=target)
                b = waiting.builder
                return Effects(events=[
                    SteerAccepted(sequence_number=b.next_seq(), steer=ref, stream_id=lane),
                    SteerPending(sequence_number=b.next_seq(), required_input=waiting.calls, steer=ref,
                                 stream_id=lane)])
            for name, candidate in self._lanes.items():
                if candidate.latest is not None and candidate.latest.response_id == target:
                    lane = name
                    raise SteerError("response_already_completed", "The response already completed.")
            raise SteerError("response_not_found", f"No response with id '{target}' on this connection.")
        except SteerError as exc:
            return Effects(events=[SteerFailed(
                error=SteerFailedError(code=exc.code or "invalid_input", message=exc.message), stream_id=lane,
                steer={"input": event.input, "previous_response_id": str(target)})])

    def _steer_active(self, turn: Turn, items: list[InputItem]) -> Effects:
        b = turn.builder
        ref = SteerRef(id=new_id("steer"), previous_response_id=b.response.id)
        fx = Effects(events=[SteerAccepted(sequence_number=b.next_seq(), steer=ref, stream_id=turn.lane)])
        # Stop at this chunk boundary (incomplete, "steered"); the successor goes first on the lane.
        fx.events += b.cut("steered")
        fx.cancel.append(turn.turn_id)
        turn.timer.inference_done()
        self._pending.appendleft((turn.lane, successor(turn.create, b.response.id, items), PhaseTimer(self._perf)))
        fx += self._finish(turn, failed=False)
        return fx

    # ------------------------------------------------------------------ scheduling
    def _schedule(self) -> Effects:
        """Start queued creates, oldest first, whose lane is idle, up to ``max_inflight``."""
        fx = Effects()
        for item in list(self._pending):
            if self.inflight >= self.config.max_inflight:
                break
            lane_name, create, timer = item
            if self._lanes[lane_name].busy:
                continue
            self._pending.remove(item)
            timer.restart()
            fx += self._start(lane_name, create, timer)
        return fx

    def _start(self, lane_name: str | None, create: ResponseCreate, timer: PhaseTimer) -> Effects:
        """Resolve ``previous_response_id`` when the request starts: the lanes' cache first,
        then (``store:true`` responses) the store, else ``previous_response_not_found``."""
        lane = self._lanes[lane_name]
        lane.busy = True
        if create.previous_response_id is None:
            return self._begin(lane_name, create, None, timer)
        cached = self._cached(create.previous_response_id)
        if cached is not None:
            return self._begin(lane_name, create, cached, timer)
        load_id = next(self._ids)
        self._loading[load_id] = (lane_name, create, timer, self._perf())
        return Effects(load=[Load(load_id, create.previous_response_id, self.owner)])

    def on_loaded(self, load_id: int, record: StoredResponse | None) -> Effects:
        """The store's answer to a :class:`Load` (``None``: not found for this owner)."""
        lane_name, create, timer, asked = self._loading.pop(load_id)
        timer.ms["history_load"] += (self._perf() - asked) * 1000.0
        if record is None:
            return self._reject(lane_name, PreviousResponseNotFound(create.previous_response_id or ""))
        try:
            parent = from_record(record, self._prep.new_scan, timer)
        except Exception:  # noqa: BLE001 - a damaged record is a server fault, not the client's
            return self._reject(lane_name, ServerError())
        return self._begin(lane_name, create, parent, timer)

    def _reject(self, lane_name: str | None, exc: APIError, *, evict: bool = False) -> Effects:
        self._lanes[lane_name].busy = False
        if evict:
            self._evict(lane_name)
        fx = Effects(events=[error_event(exc, stream_id=lane_name)])
        fx += self._schedule()
        return fx

    def _begin(self, lane_name: str | None, create: ResponseCreate, parent: ContextEntry | None,
               timer: PhaseTimer) -> Effects:
        lane = self._lanes[lane_name]
        same_lane = parent is not None and lane.latest is parent
        items = create.items
        waiting = self._waiting.get(create.previous_response_id or "")
        if waiting is not None and waiting.lane == lane_name:
            del self._waiting[create.previous_response_id or ""]
            items = waiting.items + items  # queued steer input first, in submission order
        try:
            with timer.phase("parse_validate"):
                call_ids, tool_results = self._check_calls(parent, items)
            with timer.phase("render"):
                specs, tool_tokens = self._prep.tools(create.function_tools)
                input_tokens = render_items(items)
                prompt = array("I", tool_tokens)
                prompt.extend(chat_format.render_instructions(create.instructions))
                if parent is not None:
                    prompt.extend(parent.tokens)
                prompt.extend(input_tokens)
            if len(prompt) > self.config.max_input_tokens:
                raise InvalidRequest(
                    f"The input has {len(prompt)} tokens; the limit is {self.config.max_input_tokens}.",
                    param="input", code="context_length_exceeded")
            with timer.phase("classify"):
                scan = self._prep.scan(parent.scan if parent is not None else None, items)
        except APIError as exc:
            return self._reject(lane_name, exc, evict=same_lane)

        store = True if create.store is None else create.store
        generate = create.generate is not False and not (create.prompt_cache_options or {}).get("prewarm")
        response = self._response_object(create, store)
        turn = Turn(
            turn_id=next(self._ids),
            lane=lane_name,
            request=InferenceRequest(
                request_id=response.id,
                model=response.model,
                prompt_token_ids=prompt,
                tools=specs,
                tool_choice=_tool_choice_name(create.tool_choice),
                parallel_tool_calls=response.parallel_tool_calls,
                tool_results_in_context=tool_results,
                max_output_tokens=create.max_output_tokens,
                generate=generate,
                session_key=self.session_key,
                metadata=tuple(sorted((create.metadata or {}).items())),
            ),
            builder=ResponseBuilder(
                response, stream_id=lane_name, clock=self._clock,
                output_scan=self._prep.new_scan() if self.config.safety.enabled else None,
                pause_on_calls=self.append_mode),
            parent=parent,
            same_lane_parent=same_lane,
            inputs=input_dicts(items),
            input_tokens=input_tokens,
            call_ids=call_ids,
            store=store,
            scan=scan,
            timer=timer,
            timings_requested=(create.metadata or {}).get(METADATA_KEY) == "1",
            create=create,
            prefix_len=len(prompt) - len(input_tokens) - (len(parent.tokens) if parent else 0),
        )
        self._turns[turn.turn_id] = turn
        timer.wait_inference()
        return Effects(events=turn.builder.start(), start=[turn])

    def _cached(self, response_id: str) -> ContextEntry | None:
        for lane in self._lanes.values():
            if lane.latest is not None and lane.latest.response_id == response_id:
                return lane.latest
        return None

    def _check_calls(self, parent: ContextEntry | None, items: Sequence[InputItem]) -> tuple[frozenset[str], int]:
        """Every ``function_call_output`` must answer a call the conversation issued."""
        call_ids = set(parent.call_ids) if parent else set()
        results = parent.tool_results if parent else 0
        for i, item in enumerate(items):
            results += count_calls([item], call_ids)
            if isinstance(item, FunctionCallOutputItem) and item.call_id not in call_ids:
                raise InvalidRequest(
                    f"No tool call found for function call output with call_id {item.call_id}.",
                    param=f"input[{i}].call_id")
        return frozenset(call_ids), results

    def _evict(self, lane_name: str | None) -> None:
        self._lanes[lane_name].latest = None

    def _response_object(self, create: ResponseCreate, store: bool) -> ResponseObject:
        return ResponseObject(
            id=new_id("resp"),
            created_at=int(self._clock()),
            status="in_progress",
            model=create.model or "",
            instructions=create.instructions,
            max_output_tokens=create.max_output_tokens,
            max_tool_calls=create.max_tool_calls,
            parallel_tool_calls=True if create.parallel_tool_calls is None else create.parallel_tool_calls,
            previous_response_id=create.previous_response_id,
            reasoning=create.reasoning,
            store=store,
            temperature=create.temperature if create.temperature is not None else 1.0,
            top_p=create.top_p if create.top_p is not None else 1.0,
            text=create.text or {"format": {"type": "text"}},
            tool_choice=create.tool_choice if create.tool_choice is not None else "auto",
            tools=[_echo_tool(t) for t in create.tools or ()],
            truncation=create.truncation or "disabled",
            user=create.user,
            metadata=create.metadata or {},
            service_tier=create.service_tier or "default",
            prompt_cache_key=create.prompt_cache_key,
            safety_identifier=create.safety_identifier,
        )

    # ------------------------------------------------------------------ inference side
    def on_inference(self, turn_id: int, chunk: Sequence[InferenceEvent]) -> Effects:
        """A chunk of model output for a started turn."""
        turn = self._turns.get(turn_id)
        if turn is None:
            return Effects()
        fx = Effects(events=turn.builder.feed(chunk))
        if turn.builder.paused:
            self._pause(turn)
        elif turn.builder.finishing:
            turn.timer.inference_done()
            if not any(isinstance(ev, Done) for ev in chunk):
                fx.cancel.append(turn.turn_id)  # cut by the output classifier
            fx += self._finish(turn, failed=False)
        return fx

    def on_inference_error(self, turn_id: int, exc: BaseException) -> Effects:
        """The model call failed after ``response.created``: ``response.failed``."""
        turn = self._turns.get(turn_id)
        if turn is None:
            return Effects()
        code = getattr(exc, "code", None)
        fx = Effects(events=turn.builder.fail(code=code if code in RESPONSE_ERROR_CODES else "server_error"))
        fx += self._finish(turn, failed=True)
        return fx

    def _finish(self, turn: Turn, *, failed: bool) -> Effects:
        del self._turns[turn.turn_id]
        lane = self._lanes[turn.lane]
        lane.busy = False
        fx = Effects()
        if failed:
            if turn.same_lane_parent:
                self._evict(turn.lane)
        else:
            b, timer = turn.builder, turn.timer
            response = b.response
            with timer.phase("post"):
                if turn.convo is not None:  # an append-mode rollout: one response, many calls
                    self._pause(turn)
                    tokens, items = turn.convo
                    call_ids = turn.call_ids | {o.call_id for o in response.output if isinstance(o, OutputFunctionCall)}
                    entry = ContextEntry(response.id, tokens, items, call_ids,
                                         turn.request.tool_results_in_context, turn.store, turn.scan)
                else:
                    entry = extend(turn.parent, response.id, input_tokens=turn.input_tokens, inputs=turn.inputs,
                                   output=response.output, call_ids=turn.call_ids,
                                   tool_results=turn.request.tool_results_in_context, store=turn.store,
                                   scan=turn.scan)
                lane.latest = entry
                self._bound_cache(lane)
                fx.usage.append(self._usage(turn))
            report = timer.report(b.queue_ms, b.prefill_ms, b.decode_ms)
            fx.timings.append(report)
            terminal = b.terminal(as_metadata(report) if turn.timings_requested else None)
            fx.events.append(terminal)
            self._remember_calls(turn)
            if turn.store:  # the record is the response as sent, terminal metadata included
                fx.persist.append(StoredResponse(
                    id=response.id, owner=self.owner, created_at=self._clock(),
                    response=response.model_dump(mode="json"), input_items=turn.inputs,
                    context=entry.items))
        fx += self._schedule()
        return fx

    # ------------------------------------------------------------------ append mode
    def _pause(self, turn: Turn) -> None:
        """Fold the output items produced since the last model call into the rollout's
        conversation (append mode); remember which calls now wait for results."""
        if turn.convo is None:
            tokens = array("I", turn.parent.tokens) if turn.parent else array("I")
            tokens.extend(turn.input_tokens)
            turn.convo = (tokens, (turn.parent.items if turn.parent else []) + turn.inputs)
        tokens, items = turn.convo
        new = [o for o in turn.builder.output if o.id not in {i.get("id") for i in items}]
        tokens.extend(render_items(new))
        items += [output_as_input(o) for o in new]
        turn.scan.feed_all(item_text(o) for o in new)
        turn.open_calls |= {o.call_id for o in new if isinstance(o, OutputFunctionCall)}

    def _on_append(self, event: ResponseAppend) -> Effects:
        """``response.append``: tool results for a paused response; sampling resumes in it."""
        turn = next((t for t in self._turns.values() if t.builder.response.id == event.response_id), None)
        if not self.append_mode:
            return Effects(events=[error_event(UnknownEventType(
                "Unsupported event type 'response.append'.", param="type"))])
        if turn is None or not turn.builder.paused:
            return Effects(events=[error_event(InvalidRequest(
                f"No response '{event.response_id}' is waiting for tool results.", param="response_id"))])
        try:
            for i, item in enumerate(event.input):
                if not isinstance(item, FunctionCallOutputItem) or item.call_id not in turn.open_calls:
                    raise InvalidRequest("response.append takes function_call_output items for the "
                                         "response's open calls.", param=f"input[{i}]")
            scan = self._prep.scan(turn.scan, event.input)
        except APIError as exc:
            return Effects(events=[error_event(exc, stream_id=turn.lane)])
        tokens, items = turn.convo  # type: ignore[misc]
        tokens.extend(render_items(event.input))
        items += input_dicts(event.input)
        turn.scan = scan
        turn.open_calls -= {i.call_id for i in event.input}  # type: ignore[union-attr]
        prompt = array("I", turn.request.prompt_token_ids[: turn.prefix_len])  # tools + instructions
        prompt.extend(tokens)
        turn.request = replace(turn.request, prompt_token_ids=prompt,
                               tool_results_in_context=turn.request.tool_results_in_context + len(event.input))
        turn.builder.resume()
        return Effects(start=[turn])

    def _bound_cache(self, keep: _Lane) -> None:
        """Keep the connection's cached tokens under ``max_cached_tokens``: evict the other
        lanes' entries, least recently updated first (spec §4: a later continuation from an
        evicted store:false response fails with previous_response_not_found)."""
        self._lru = [lane for lane in self._lru if lane is not keep] + [keep]
        total = sum(len(lane.latest.tokens) for lane in self._lru if lane.latest is not None)
        for lane in self._lru[:-1]:
            if total <= self.config.max_cached_tokens:
                break
            if lane.latest is not None:
                total -= len(lane.latest.tokens)
                lane.latest = None

    def _remember_calls(self, turn: Turn) -> None:
        """The lane's latest response, if it stopped on function calls, can take steer input."""
        for rid, waiting in list(self._waiting.items()):
            if waiting.lane == turn.lane:
                del self._waiting[rid]
        r = turn.builder.response
        calls = [RequiredInput(call_id=o.call_id, name=o.name) for o in r.output if isinstance(o, OutputFunctionCall)]
        if calls and r.status == "completed":
            self._waiting[r.id] = _Waiting(turn.lane, turn.builder, calls)

    def _usage(self, turn: Turn) -> UsageEntry:
        r = turn.builder.response
        assert r.usage is not None
        return UsageEntry(
            response_id=r.id, owner=self.owner, model=r.model, transport=self.transport,  # type: ignore[arg-type]
            input_tokens=r.usage.input_tokens, cached_tokens=r.usage.input_tokens_details.cached_tokens,
            output_tokens=r.usage.output_tokens, created_at=self._clock())


def _tool_choice_name(choice: str | dict | None) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return choice
    return str(choice.get("name") or choice.get("mode") or "auto")


def _echo_tool(tool: object) -> dict:
    if isinstance(tool, FunctionTool):
        data = tool.model_dump()
        data.setdefault("description", None)
        data["strict"] = True if tool.strict is None else tool.strict
        return data
    return tool.model_dump()  # type: ignore[attr-defined]
