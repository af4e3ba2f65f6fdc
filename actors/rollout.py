"""The opt-in ``response.append`` rollout mode (docs/append-mode.md): one response per
rollout, paused on each tool call, resumed with the client's tool results in the same
response.  Mixed into :class:`actors.session.Session`."""

from __future__ import annotations

from array import array
from dataclasses import replace

from .context import input_dicts
from .errors import APIError, InvalidRequest, UnknownEventType
from .protocol import (
    FunctionCallOutputItem,
    OutputFunctionCall,
    ResponseAppend,
    error_event,
    output_as_input,
)
from .render import item_text, render_items
from .turn import Effects, Turn


class AppendMixin:
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

