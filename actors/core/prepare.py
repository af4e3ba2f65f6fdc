"""Per-connection request preparation that is reused while it stays valid.

A WebSocket connection keeps one :class:`Preparer`: tool definitions are validated and
rendered once and reused while unchanged, so are the instructions' tokens (a coding agent
resends the same several thousand tokens of instructions with every create), the model is
resolved once, and the safety classifier's rules are compiled once.  On a session host its
connections share their instructions' and tools' renderings too, by content
(:class:`~actors.core.prompt_parts.PromptParts`): a storm of first turns resending one
system prompt renders and validates it once.  The HTTP path makes a fresh one per request,
with no shared cache — the stateless baseline redoes all of it.
"""

from __future__ import annotations

import marshal
import re
from array import array
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple, TypeAlias

from pydantic import TypeAdapter

from inference.formats import CL100K, ChatFormat
from inference.types import ToolSpec

from ..errors import APIError, InvalidRequest, ModelNotFound
from ..protocol import CustomTool, FunctionTool, InputItem, Tool
from ..protocol.wire_types import JSONObject
from .prompt_parts import PromptParts
from .render import item_text, tool_specs
from .response_builder import echo_tools
from .safety import Classifier, Matcher, SafetyConfig, build_matcher

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128


class ContentFiltered(APIError):
    code = "content_filter"

    def __init__(self, categories: Sequence[str]) -> None:
        super().__init__(
            f"The input was flagged by the safety classifier ({', '.join(categories)}).", param="input"
        )


class Tools(NamedTuple):
    """A request's tools, prepared: the function and custom tools' validated ``specs`` and
    their ``tokens`` (rendered), and ``echoed``, every tool as a Response echoes it — one list,
    never changed, that the connection's responses share while the definitions are unchanged
    (the encoder reuses its JSON without comparing it, actors.protocol.EventEncoder)."""

    specs: tuple[ToolSpec, ...]
    tokens: array[int]  # a prompt starts as a copy of it: one memcpy (from a list, ~10 µs)
    echoed: list[JSONObject]


SharedParts: TypeAlias = PromptParts[Tools]  # a session host's, shared by its connections

_TOOLS_JSON: TypeAdapter[list[Tool]] = TypeAdapter(list[Tool])


class Preparer:
    def __init__(
        self,
        models: Collection[str],
        safety: SafetyConfig,
        formats: Mapping[str, ChatFormat] | None = None,
        shared: SharedParts | None = None,
    ) -> None:
        self._shared = shared
        self._models = frozenset(models)
        self._formats = dict(formats or {})  # a model's own chat format; else cl100k (the emulator's)
        self._resolved: dict[str, str] = {}
        # The last tools' content (``tools_key``: a string, nothing the collector tracks), not
        # the parsed definitions: those go with their request; and the last list the host's
        # parser kept (actors.protocol.Recurring): the same object while they are resent.
        self._tools_seen: tuple[str, str] | None = None
        self._tools_kept: tuple[Sequence[Tool], str] | None = None
        self._tools = Tools((), array("I"), [])
        self._instructions: tuple[str | None, str, array[int]] = (None, CL100K.name, array("I"))
        self._safety = safety
        self.matcher: Matcher = build_matcher(safety)

    def resolve_model(self, model: str | None) -> str:
        """Model id → served profile (resolved once per connection)."""
        if model is None:
            raise InvalidRequest(
                "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
            )
        if model in self._resolved:
            return self._resolved[model]
        if model not in self._models:
            raise ModelNotFound(model)
        self._resolved[model] = model
        return model

    def format(self, model: str) -> ChatFormat:
        """The chat format ``model`` renders with."""
        return self._formats.get(model, CL100K)

    def formats(self) -> list[ChatFormat]:
        """The chat formats of the models that have their own (the rest render with cl100k)."""
        return list(self._formats.values())

    def tools(self, tools: Sequence[Tool], fmt: ChatFormat = CL100K) -> Tools:
        """The request's tools (``create.tools``) prepared (:class:`Tools`); reused while the
        definitions and the format are unchanged."""
        kept = self._tools_kept
        if kept is not None and kept[0] is tools and kept[1] == fmt.name:
            return self._tools
        if self._shared is not None and tools:
            shared = self._shared
            self._tools = shared.tools_of(
                tools, fmt.name, lambda: tools_key(tools), lambda: prepared_tools(tools, fmt)
            )
            self._tools_kept, self._tools_seen = (tools, fmt.name), None
            return self._tools
        key = tools_key(tools) if tools else ""
        if self._tools_seen != (key, fmt.name):
            self._tools = prepared_tools(tools, fmt)
            self._tools_seen, self._tools_kept = (key, fmt.name), None
        return self._tools

    def instructions(self, text: str | None, fmt: ChatFormat = CL100K) -> array[int]:
        """The rendered instructions (``array("I")``, 4 bytes a token); re-rendered only when
        the text (or the format) differs from the last request's (comparing the strings costs
        microseconds, tokenising them milliseconds).  Only the latest text is kept."""
        if text != self._instructions[0] or fmt.name != self._instructions[1]:
            if self._shared is None or not text:
                rendered = array("I", fmt.render_instructions(text))
            else:
                rendered = self._shared.instructions.get(
                    (fmt.name, text), lambda: array("I", fmt.render_instructions(text))
                )
            self._instructions = (text, fmt.name, rendered)
        return self._instructions[2]

    def new_scan(self) -> Classifier:
        return Classifier(self.matcher, self._safety.thresholds)

    def scan(self, state: Classifier | None, items: Sequence[InputItem]) -> Classifier:
        """``state`` (the conversation so far) extended by ``items``; raises
        :class:`ContentFiltered` if the conversation is flagged.  ``state`` is not changed."""
        scan = state.copy() if state is not None else self.new_scan()
        if self._safety.enabled:
            scan.feed_all(item_text(item) for item in items)
            verdict = scan.verdict
            if verdict.flagged:
                raise ContentFiltered(verdict.categories)
        return scan


def tools_key(tools: Sequence[Tool]) -> str:
    """The tools' content exactly, as a key of the host's shared parts: ``marshal``'s bytes
    (format 2: no back-references, so equal content writes equal bytes; types kept, ``true``
    is not ``1``) of each tool's class, fields and extra keys, ~10 µs for a coding agent's
    tools against ~80 µs to encode them as JSON; JSON for a value marshal cannot write."""
    try:
        parts = [(type(t).__name__, t.__dict__, t.__pydantic_extra__) for t in tools]
        return "m" + marshal.dumps(parts, 2).decode("latin-1")
    except ValueError:
        return "j" + _TOOLS_JSON.dump_json(list(tools)).decode()


def prepared_tools(tools: Sequence[Tool], fmt: ChatFormat) -> Tools:
    """Validated, rendered and echoed (raises an :class:`~actors.errors.APIError` for a bad
    definition)."""
    callable_tools = [t for t in tools if isinstance(t, (FunctionTool, CustomTool))]
    validate_tools(callable_tools)
    specs = tool_specs(callable_tools)
    return Tools(specs, array("I", fmt.render_tools(specs)), echo_tools(tools))


def validate_tools(tools: Sequence[FunctionTool | CustomTool]) -> None:
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"At most {MAX_TOOLS} function and custom tools are supported.", param="tools")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not TOOL_NAME.fullmatch(tool.name):
            raise InvalidRequest("Function names must match ^[a-zA-Z0-9_-]{1,64}$.", param=f"tools[{i}].name")
        if tool.name in seen:
            raise InvalidRequest(f"Duplicate function name '{tool.name}'.", param=f"tools[{i}].name")
        seen.add(tool.name)
        params = tool.parameters if isinstance(tool, FunctionTool) else None
        if params is not None and params.get("type", "object") != "object":
            raise InvalidRequest(
                "Function parameters must be a JSON schema of type 'object'.", param=f"tools[{i}].parameters"
            )
