"""A request's model call, made once its history is known and its input rendered: the prompt
(tools, instructions, the parent — compacted if it must be, :mod:`actors.core.compaction` —
and the input), its token limit, the :class:`~inference.types.InferenceRequest` and the
:class:`~actors.core.turn.Turn` that carries it until its response ends."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.types import InferenceRequest

from ..config import SessionConfig
from ..errors import InvalidRequest
from ..ids import new_id
from ..protocol import PromptCacheOptions
from . import compaction, inject
from .context import PromptMarks, input_dicts
from .prepare import Preparer
from .render import MarkedTokens
from .request_queue import Request
from .response_builder import parallel_tool_calls, tool_choice_name
from .timings import METADATA_KEY
from .turn import NewResponse, Turn


@dataclass(frozen=True, slots=True)
class TurnStart:
    """What every turn of a connection is made with."""

    prep: Preparer
    config: SessionConfig
    session_key: str | None
    owner: str
    transport: str
    append_mode: bool
    clock: Callable[[], float]
    marks: PromptMarks = field(default_factory=PromptMarks)  # the last turn's prompt breakpoints

    def turn(self, request: Request, rendered: MarkedTokens) -> Turn:
        """The started turn of a checked request (:attr:`Request.checked`) whose input is
        ``rendered``; raises an :class:`~actors.errors.APIError` for a prompt it refuses."""
        input_tokens = rendered.tokens
        begun = request.checked
        assert begun is not None
        create, timer = request.create, request.timer
        parent, items = begun.parent, begun.items
        fmt = self.prep.format(create.model or "")
        config = self.config
        with timer.phase("render"):
            tools = self.prep.tools(create.tools or (), fmt)
            prompt = array("I", tools.tokens)
            prompt.extend(self.prep.instructions(create.instructions, fmt))
            # Server-side compaction (actors.core.compaction): the parent, compacted.
            whole = len(prompt) + (len(parent.tokens) if parent else 0) + len(input_tokens)
            compacted = compaction.compacted(create, whole, parent, fmt, config.max_input_tokens)
            if compacted is not None:
                parent = compacted.parent
            if parent is not None:
                prompt.extend(parent.tokens)
            prompt.extend(input_tokens)
        if len(prompt) > config.max_input_tokens:
            raise InvalidRequest(
                f"The input has {len(prompt)} tokens; the limit is {config.max_input_tokens}.",
                param="input",
                code="context_length_exceeded",
            )
        with timer.phase("classify"):
            scan = self.prep.scan(parent.scan if parent is not None else None, items)

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
            breakpoints=self.marks(prefix_len, parent, rendered.marks),
        )
        timer.wait_inference()
        # The call is ready: the response and its first events are made once the driver
        # has started it (CallsStarted).
        return Turn(
            turn_id=request.id,
            lane=request.lane,
            request=call,
            response_from=NewResponse(
                create,
                store,
                tools.echoed,
                self.clock,
                output_scan=self.prep.new_scan() if config.safety.enabled else None,
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
