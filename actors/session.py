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
from array import array
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from inference import chat_format
from inference.types import Done, InferenceEvent, InferenceRequest

from .config import SessionConfig
from .errors import APIError, InvalidRequest, ModelNotFound, PreviousResponseNotFound, StreamLimitReached
from .ids import new_id
from .protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    OutputFunctionCall,
    ResponseCreate,
    ResponseObject,
    ResponseSteer,
    ServerEvent,
    SteerFailed,
    SteerFailedError,
    error_event,
    parse_client_event,
)
from .render import render_items, tool_specs
from .response_builder import ResponseBuilder


@dataclass(slots=True)
class ContextEntry:
    """What a lane caches for its latest response (spec §4.2)."""

    response_id: str
    tokens: array  # rendered conversation (items only; tools/instructions are per request)
    call_ids: frozenset[str]  # function calls issued anywhere in the conversation
    tool_results: int  # function_call_output items in the conversation
    store: bool


@dataclass(slots=True)
class Turn:
    """A started response: the model call to run and the builder of its events."""

    turn_id: int
    lane: str | None
    request: InferenceRequest
    builder: ResponseBuilder
    parent: ContextEntry | None
    same_lane_parent: bool
    input_items: list[InputItem]
    input_tokens: list[int]
    call_ids: frozenset[str]
    store: bool


@dataclass(slots=True)
class Effects:
    """What the driver must do: send these events, start these model calls."""

    events: list[ServerEvent] = field(default_factory=list)
    start: list[Turn] = field(default_factory=list)

    def __iadd__(self, other: Effects) -> Effects:
        self.events += other.events
        self.start += other.start
        return self


@dataclass(slots=True)
class _Lane:
    latest: ContextEntry | None = None
    active: Turn | None = None


class Session:
    def __init__(
        self,
        config: SessionConfig,
        models: Collection[str],
        *,
        session_key: str,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.models = frozenset(models)
        self.session_key = session_key
        self._clock = clock
        self._lanes: dict[str | None, _Lane] = {None: _Lane()}
        self._pending: deque[tuple[str | None, ResponseCreate]] = deque()
        self._turns: dict[int, Turn] = {}
        self._turn_ids = itertools.count()

    # ------------------------------------------------------------------ client side
    @property
    def inflight(self) -> int:
        return len(self._turns)

    def on_frame(self, data: str | bytes) -> Effects:
        """One client frame.  Errors become ``error`` events; the session stays usable."""
        try:
            event = parse_client_event(data)
        except APIError as exc:
            return Effects(events=[error_event(exc)])
        if isinstance(event, ResponseSteer):
            return Effects(events=[self._steer_unsupported(event)])
        if not isinstance(event, ResponseCreate):
            return Effects()  # response.processed: nothing to do
        lane = event.stream_id
        try:
            self._admit(event)
        except APIError as exc:
            # An invalid stream_id is never echoed; a rejected new lane is (spec §5.2).
            return Effects(events=[error_event(exc, stream_id=lane)])
        self._lanes.setdefault(lane, _Lane())
        self._pending.append((lane, event))
        return self._schedule()

    def _admit(self, create: ResponseCreate) -> None:
        """Checks that need no history: they fail before anything is queued."""
        if create.background:
            raise InvalidRequest("Background mode is not supported over WebSocket.", param="background")
        if self.config.strict_params and create.model_extra:
            name = next(iter(create.model_extra))
            raise InvalidRequest(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
        if create.model not in self.models:
            raise ModelNotFound(create.model)
        named = len(self._lanes) - 1
        if create.stream_id is not None and create.stream_id not in self._lanes and named >= self.config.max_named_lanes:
            raise StreamLimitReached(self.config.max_named_lanes)

    def _steer_unsupported(self, steer: ResponseSteer) -> SteerFailed:
        return SteerFailed(
            error=SteerFailedError(code="steering_not_supported",
                                   message="Steering is not supported by this server yet."),
            steer={"input": steer.input, "previous_response_id": str(steer.previous_response_id)},
        )

    # ------------------------------------------------------------------ scheduling
    def _schedule(self) -> Effects:
        """Start queued creates, oldest first, whose lane is idle, up to ``max_inflight``."""
        fx = Effects()
        for item in list(self._pending):
            if self.inflight >= self.config.max_inflight:
                break
            lane_name, create = item
            if self._lanes[lane_name].active is not None:
                continue
            self._pending.remove(item)
            fx += self._start(lane_name, create)
        return fx

    def _start(self, lane_name: str | None, create: ResponseCreate) -> Effects:
        lane = self._lanes[lane_name]
        parent, same_lane = None, False
        try:
            if create.previous_response_id is not None:
                parent = self._lookup(create.previous_response_id)
                same_lane = lane.latest is parent
            items = create.items
            call_ids, tool_results = self._check_calls(parent, items)
        except APIError as exc:
            if same_lane:
                self._evict(lane_name)
            fx = Effects(events=[error_event(exc, stream_id=lane_name)])
            fx += self._schedule()
            return fx

        tools = create.function_tools
        input_tokens = render_items(items)
        context = parent.tokens if parent is not None else array("I")
        prompt = array("I", chat_format.render_tools(tool_specs(tools)))
        prompt.extend(chat_format.render_instructions(create.instructions))
        prompt.extend(context)
        prompt.extend(input_tokens)
        store = True if create.store is None else create.store
        generate = create.generate is not False and not (create.prompt_cache_options or {}).get("prewarm")
        response = self._response_object(create, store)
        turn = Turn(
            turn_id=next(self._turn_ids),
            lane=lane_name,
            request=InferenceRequest(
                request_id=response.id,
                model=response.model,
                prompt_token_ids=prompt,
                tools=tool_specs(tools),
                tool_choice=_tool_choice_name(create.tool_choice),
                parallel_tool_calls=response.parallel_tool_calls,
                tool_results_in_context=tool_results,
                max_output_tokens=create.max_output_tokens,
                generate=generate,
                session_key=self.session_key,
                metadata=tuple(sorted((create.metadata or {}).items())),
            ),
            builder=ResponseBuilder(response, stream_id=lane_name, clock=self._clock),
            parent=parent,
            same_lane_parent=same_lane,
            input_items=items,
            input_tokens=input_tokens,
            call_ids=call_ids,
            store=store,
        )
        lane.active = turn
        self._turns[turn.turn_id] = turn
        return Effects(events=turn.builder.start(), start=[turn])

    def _lookup(self, response_id: str) -> ContextEntry:
        for lane in self._lanes.values():
            if lane.latest is not None and lane.latest.response_id == response_id:
                return lane.latest
        raise PreviousResponseNotFound(response_id)

    def _check_calls(self, parent: ContextEntry | None, items: Sequence[InputItem]) -> tuple[frozenset[str], int]:
        """Every ``function_call_output`` must answer a call the conversation issued."""
        call_ids = set(parent.call_ids) if parent else set()
        results = parent.tool_results if parent else 0
        for i, item in enumerate(items):
            if isinstance(item, FunctionCallItem):
                call_ids.add(item.call_id)
            elif isinstance(item, FunctionCallOutputItem):
                if item.call_id not in call_ids:
                    raise InvalidRequest(
                        f"No tool call found for function call output with call_id {item.call_id}.",
                        param=f"input[{i}].call_id")
                results += 1
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
        if any(isinstance(ev, Done) for ev in chunk):
            fx += self._finish(turn, failed=False)
        return fx

    def on_inference_error(self, turn_id: int, exc: BaseException) -> Effects:
        """The model call failed after ``response.created``: ``response.failed``."""
        turn = self._turns.get(turn_id)
        if turn is None:
            return Effects()
        code = exc.code if isinstance(exc, APIError) and exc.code else "server_error"
        fx = Effects(events=turn.builder.fail(code=code))
        fx += self._finish(turn, failed=True)
        return fx

    def _finish(self, turn: Turn, *, failed: bool) -> Effects:
        del self._turns[turn.turn_id]
        lane = self._lanes[turn.lane]
        lane.active = None
        if failed:
            if turn.same_lane_parent:
                self._evict(turn.lane)
        else:
            lane.latest = self._entry_after(turn)
        return self._schedule()

    def _entry_after(self, turn: Turn) -> ContextEntry:
        output = turn.builder.output
        tokens = array("I", turn.parent.tokens) if turn.parent else array("I")
        tokens.extend(turn.input_tokens)
        tokens.extend(render_items(output))
        call_ids = turn.call_ids.union(
            item.call_id for item in output if isinstance(item, OutputFunctionCall))
        return ContextEntry(
            response_id=turn.builder.response.id,
            tokens=tokens,
            call_ids=call_ids,
            tool_results=turn.request.tool_results_in_context,
            store=turn.store,
        )


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
