"""The opt-in ``response.append`` rollout mode (docs/append-mode.md): one response per
rollout, paused on each tool call, resumed with the client's tool results in the same
response.

Pure functions over the :class:`~actors.core.turn.Rollout` record a turn keeps: each returns the
next record and changes nothing it is given.  The session decides when they apply.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import replace

from inference.formats import ChatFormat
from inference.types import InferenceRequest

from ..errors import InvalidRequest
from ..protocol import CustomToolCallOutputItem, FunctionCallOutputItem, InputItem, OutputItem, issued_call_id
from .context import extend, input_dicts, prompt_breakpoints
from .render import render_marked
from .safety import Classifier
from .turn import Rollout, Turn


def begin(turn: Turn) -> Rollout:
    """The rollout before the turn's first model call: its parent's conversation and input."""
    context = extend(
        turn.parent,
        turn.builder.response.id,
        input_tokens=turn.input_tokens,
        inputs=turn.inputs,
        output=(),
        call_ids=turn.call_ids,
        tool_results=turn.request.tool_results_in_context,
        store=turn.store,
        scan=turn.scan.copy(),
        fmt=turn.fmt,
        input_marks=turn.input_marks,
    )
    return Rollout(context)


def fold(rollout: Rollout, output: Sequence[OutputItem], fmt: ChatFormat) -> Rollout:
    """The rollout once a model call stopped: the response's output items past ``folded``
    join the conversation (rendered in ``fmt``), and the calls among them wait for results."""
    new = output[rollout.folded :]
    ctx = rollout.context
    context = extend(
        ctx,
        ctx.response_id,
        input_tokens=(),
        inputs=[],
        output=new,
        call_ids=ctx.call_ids,
        tool_results=ctx.tool_results,
        store=ctx.store,
        scan=ctx.scan.copy(),
        fmt=fmt,
    )
    issued = {call_id for o in new if (call_id := issued_call_id(o)) is not None}
    return Rollout(context, len(output), rollout.open_calls | issued)


ToolResult = FunctionCallOutputItem | CustomToolCallOutputItem


def tool_results(rollout: Rollout, items: Sequence[InputItem]) -> list[ToolResult]:
    """``items`` if they are results for the rollout's open calls; :class:`InvalidRequest`
    otherwise (``response.append`` carries nothing else)."""
    results = []
    for i, item in enumerate(items):
        if not isinstance(item, ToolResult) or item.call_id not in rollout.open_calls:
            raise InvalidRequest(
                "response.append takes function_call_output (or custom_tool_call_output) "
                "items for the response's open calls.",
                param=f"input[{i}]",
            )
        results.append(item)
    return results


def answer(rollout: Rollout, results: Sequence[ToolResult], scan: Classifier, fmt: ChatFormat) -> Rollout:
    """The rollout with the client's tool results appended (``scan`` has read them)."""
    ctx = rollout.context
    tokens, marks = render_marked(results, fmt)
    context = extend(
        ctx,
        ctx.response_id,
        input_tokens=tokens,
        inputs=input_dicts(results),
        output=(),
        call_ids=ctx.call_ids,
        tool_results=ctx.tool_results + len(results),
        store=ctx.store,
        scan=scan,
        fmt=fmt,
        input_marks=marks,
    )
    context.fresh_tokens = ctx.fresh_tokens + len(tokens)  # no model call has read them yet
    return Rollout(context, rollout.folded, rollout.open_calls - {r.call_id for r in results})


def resume(request: InferenceRequest, prefix_len: int, rollout: Rollout) -> InferenceRequest:
    """The response's next model call: the request's first ``prefix_len`` prompt tokens
    (tools, instructions), then the rollout's conversation."""
    prompt = array("I", request.prompt_token_ids[:prefix_len])
    prompt.extend(rollout.context.tokens)
    return replace(
        request,
        prompt_token_ids=prompt,
        tool_results_in_context=rollout.context.tool_results,
        breakpoints=prompt_breakpoints(prefix_len, None, rollout.context.marks),
    )
