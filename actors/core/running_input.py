"""Client input for a response that is running: ``response.steer`` (docs/protocol.md §2.3,
:mod:`actors.core.steering`), ``response.append`` (append mode, :mod:`actors.core.rollout`)
and ``response.inject`` (:mod:`actors.core.inject`); and a paused response's resumption with
tool results.  The session owns the parts read here and dispatches to it."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import APIError, InvalidRequest, UnknownEventType
from ..protocol import InputItem, ResponseAppend, ResponseInject, ResponseSteer, error_event
from . import inject, rollout
from .history import History
from .lanes import Lanes
from .prepare import Preparer
from .request_queue import Requests, Stage
from .steering import SteerError, Steering, calls_started, steer_failed, steer_items
from .turn import Effects, Turn


class RunningInput:
    def __init__(
        self,
        prep: Preparer,
        lanes: Lanes,
        requests: Requests,
        steering: Steering,
        injections: inject.Injections,
        history: History,
        *,
        append_mode: bool,
    ) -> None:
        self._prep = prep
        self._lanes = lanes
        self._requests = requests
        self._steering = steering
        self._injections = injections
        self._history = history
        self._append_mode = append_mode

    def running(self, response_id: object) -> Turn | None:
        """The running response with this id."""
        request = self._requests.responding(response_id, Stage.RUNNING)
        return request.turn if request is not None else None

    def steer(self, event: ResponseSteer) -> tuple[Effects, Turn | None]:
        """``response.steer``: a running response stops (the turn returned, for the session
        to finish) and an automatic successor takes the input, unless it has begun a function
        call; input for a response that stopped on function calls waits for the client's
        next create."""
        target = event.previous_response_id
        try:
            items = steer_items(event)
            turn = self.running(target)
            if turn is not None:
                return self._steer_running(turn, items, event.input)
            events = self._steering.accept_stopped(target, items)
            if events is not None:
                return Effects(events=events), None
            done = self._lanes.find(target)
            if done is not None:
                raise SteerError(
                    "response_already_completed", "The response already completed.", stream_id=done[0]
                )
            raise SteerError("response_not_found", f"No response with id '{target}' on this connection.")
        except SteerError as exc:
            return Effects(events=[steer_failed(event, exc)]), None

    def _steer_running(
        self, turn: Turn, items: list[InputItem], raw_input: object
    ) -> tuple[Effects, Turn | None]:
        b = turn.builder
        fx = Effects(events=self._steering.accept_running(turn.lane, b, items, raw_input))
        if calls_started(b):
            return fx, None  # the input waits for the end of the response (the session's finish settles it)
        # Stop at this chunk boundary (incomplete, "steered"); settling the response queues
        # its successor first on the lane.
        fx.events += b.cut("steered")
        fx.cancel.append(turn.turn_id)
        turn.timer.inference_done()
        return fx, turn

    def append(self, event: ResponseAppend) -> Effects:
        """``response.append``: tool results for a paused response; sampling resumes in it."""
        if not self._append_mode:
            return Effects(
                events=[
                    error_event(UnknownEventType("Unsupported event type 'response.append'.", param="type"))
                ]
            )
        turn = self.running(event.response_id)
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
            items = self._history.resolve_running(event.input, turn)
            results = rollout.tool_results(turn.rollout, items)
            return self.resume_with(turn, results)
        except APIError as exc:
            return Effects(events=[error_event(exc, stream_id=turn.lane)])

    def inject(self, event: ResponseInject) -> Effects:
        """``response.inject``: tool output for a running response, committed now if it is
        paused on its calls, else when its model call stops (:meth:`paused`)."""
        turn = self.running(event.response_id)
        finished = self._lanes.find(event.response_id) if turn is None else None
        if turn is None or (event.stream_id is not None and event.stream_id != turn.lane):
            return Effects(events=[inject.not_running(event, finished)])
        try:
            items = self._history.resolve_running(event.input, turn)
            results = inject.check(turn, event, items, self._injections.pending(event.response_id))
            if not turn.builder.paused:
                self._injections.accept(turn, event, results)
                return Effects()
            fx = self.resume_with(turn, results)
            fx.events.insert(0, inject.created(turn))
            return fx
        except APIError as exc:
            return Effects(events=[error_event(exc, stream_id=turn.lane)])

    def paused(self, turn: Turn) -> Effects:
        """The model call of an append-mode response stopped on its calls: its output joins
        the rollout, and tool output injected while it ran is committed now."""
        turn.rollout = rollout.fold(turn.rollout or rollout.begin(turn), turn.builder.output, turn.fmt)
        injected = self._injections.commit(turn.builder.response.id)
        if not injected:
            return Effects()
        try:
            fx = self.resume_with(turn, injected)
            fx.events.append(inject.created(turn))
        except APIError as exc:
            fx = Effects(events=[error_event(exc, stream_id=turn.lane)])
        return fx

    def resume_with(self, turn: Turn, results: Sequence[rollout.ToolResult]) -> Effects:
        """Sampling resumes in a paused response with these tool results (append, inject)."""
        assert turn.rollout is not None
        scan = self._prep.scan(turn.rollout.context.scan, results)
        turn.rollout = rollout.answer(turn.rollout, results, scan, turn.fmt)
        turn.request = rollout.resume(turn.request, turn.prefix_len, turn.rollout)
        turn.builder.resume()
        return Effects(start=[turn])
