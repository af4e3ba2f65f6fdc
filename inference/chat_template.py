"""A real model's own tokenizer and chat template, as a segment-wise chat format.

:mod:`inference.chat_format` is the emulated models' format (cl100k, the project's own
separators).  A model served by a real engine (docs/backends.md) renders with its Hugging
Face tokenizer and Jinja chat template instead, through :class:`TemplateFormat`, which has
the same functions (``render_message``, ``render_tools``, … :class:`inference.formats.ChatFormat`)
so the session renders, caches and extends a conversation the same way for both.

Segments come from the template itself: a message's segment is the text the template adds
for that message after an anchor conversation, split around a sentinel that stands for the
content.  The template's pieces (``<|im_start|>user\\n`` …) are tokenised with their special
tokens; the content is tokenised as plain text (``split_special_tokens``), so a user typing
``<|im_end|>`` cannot forge a separator.  Rendering is therefore concatenative, like the
cl100k format: ``render(a + b) == render(a) + render(b)``, and a template that does not add
one message's text independently of the others is refused at load time (:class:`TemplateNotSegmentwise`).

The model's output is appended to the conversation as the engine's token ids, not re-rendered
from text (:meth:`TemplateFormat.continuation`): the generation prompt, the output ids, and
the template's closing of an assistant message.  So the next turn's prompt extends, token for
token, what the engine's prefix cache holds.

Function tools: SmolLM2's template (the tested model) has no tool syntax, so tools are
described in a system segment in the Hermes style that tool-tuned ChatML models (Qwen 2.5,
Hermes) read — ``<tools>`` JSON, calls as ``<tool_call>{"name", "arguments"}</tool_call>`` —
and :func:`parse_calls` reads calls back; an output that opens a call but is
not a valid one raises :class:`InvalidToolCall`.  A template's own ``tools`` rendering is not
used (docs/backends.md).

``transformers`` is imported only when a template is loaded (the ``real-model`` extra).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from inference.types import ToolSpec

SENTINEL = "\x00SEGMENT\x00"
ANCHOR = "\x00ANCHOR\x00"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
ROLES = {"developer": "system"}  # Responses roles a chat template may not know


class TemplateNotSegmentwise(ValueError):
    """The chat template does not render one message independently of its neighbours."""


class InvalidToolCall(Exception):
    """The model's output opened a function call that is not a valid one.  Mapped to
    ``response.failed`` (``server_error``) with this message (actors.core.session)."""

    code = "server_error"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.public_message = f"The model's output is not a valid function call: {detail}"


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class _Segment:
    before: list[int]
    after: list[int]


class TemplateFormat:
    """One model's chat format (its tokenizer folder: ``tokenizer.json`` and the template)."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tok = tokenizer
        self.name = name
        self.eos_token_id: int | None = tokenizer.eos_token_id
        self._segments: dict[str, _Segment] = {}
        base = self._text([{"role": "system", "content": ANCHOR}])
        self._base = base
        generation = self._text([{"role": "system", "content": ANCHOR}], generation_prompt=True)
        if not generation.startswith(base):
            raise TemplateNotSegmentwise("the generation prompt does not extend the conversation")
        self.generation_prompt = self._special(generation[len(base) :])
        # What the template puts before a conversation that brings no system message (a
        # default system prompt, a BOS token): the prompt starts with it when no
        # instructions are given, as the template would render it.
        alone = self._text([{"role": "user", "content": SENTINEL}])
        user = self._segment_text("user")
        if not alone.endswith(user[0] + SENTINEL + user[1]):
            raise TemplateNotSegmentwise("a user message renders differently after a system message")
        self._default_prefix = self._special(alone[: len(alone) - len(user[0] + SENTINEL + user[1])])
        self._check_concatenative()

    @classmethod
    def load(cls, path: str | Path) -> TemplateFormat:
        """The format of the tokenizer folder at ``path`` (loaded once per process)."""
        return _load(str(Path(path).expanduser().resolve()))

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer (its ``apply_chat_template`` is the reference)."""
        return self._tok

    # ------------------------------------------------------------------ tokens
    def encode(self, text: str) -> list[int]:
        """``text`` as plain text: special-token strings in it become ordinary tokens."""
        return list(self._tok.encode(text, add_special_tokens=False, split_special_tokens=True))

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def _special(self, text: str) -> list[int]:
        """The template's own text, its special tokens placed by the tokenizer."""
        return list(self._tok.encode(text, add_special_tokens=False)) if text else []

    def _text(self, messages: list[dict[str, str]], *, generation_prompt: bool = False) -> str:
        return self._tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _segment_text(self, role: str) -> tuple[str, str]:
        full = self._text([{"role": "system", "content": ANCHOR}, {"role": role, "content": SENTINEL}])
        if not full.startswith(self._base) or full.count(SENTINEL) != 1:
            raise TemplateNotSegmentwise(f"a {role!r} message does not extend the conversation before it")
        before, after = full[len(self._base) :].split(SENTINEL)
        return before, after

    def _segment(self, role: str) -> _Segment:
        role = ROLES.get(role, role)
        seg = self._segments.get(role)
        if seg is None:
            before, after = self._segment_text(role)
            seg = self._segments[role] = _Segment(self._special(before), self._special(after))
        return seg

    def _check_concatenative(self) -> None:
        """Two messages render as the first's text plus the second's."""
        u, a = self._segment_text("user"), self._segment_text("assistant")
        both = self._text(
            [
                {"role": "system", "content": ANCHOR},
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y"},
            ]
        )
        if both != self._base + u[0] + "x" + u[1] + a[0] + "y" + a[1]:
            raise TemplateNotSegmentwise("two messages do not render as the concatenation of each")

    # ------------------------------------------------------------------ ChatFormat
    def render_message(self, role: str, text: str) -> list[int]:
        seg = self._segment(role)
        return seg.before + self.encode(text) + seg.after

    def render_tools(self, tools: Sequence[ToolSpec]) -> list[int]:
        """Empty without tools, else a system segment describing them (Hermes style)."""
        if not tools:
            return []
        return self.render_message("system", tools_prompt(tools))

    def render_instructions(self, text: str | None) -> list[int]:
        """A system segment; without instructions, what the template renders before a
        conversation that has no system message (SmolLM2's default system prompt)."""
        return self.render_message("system", text) if text else list(self._default_prefix)

    def render_function_call(self, name: str, arguments: str) -> list[int]:
        return self.render_message("assistant", call_text(name, arguments))

    def render_function_call_output(self, output: str) -> list[int]:
        return self.render_message("tool", output)

    def render_custom_tool_call(self, name: str, tool_input: str) -> list[int]:
        return self.render_message("assistant", call_text(name, json.dumps({"input": tool_input})))

    def render_other(self, kind: str, text: str) -> list[int]:
        return self.render_message("user", f"<{kind}>\n{text}\n</{kind}>")

    # ------------------------------------------------------------------ output
    def continuation(self, output_ids: Sequence[int]) -> list[int]:
        """What a model call adds to the conversation: the generation prompt, the engine's
        output ids as they are, and the template's closing of an assistant message (its
        end-of-message token only if the engine did not emit it)."""
        after = self._segment("assistant").after
        ids = list(self.generation_prompt) + list(output_ids)
        if after and output_ids and output_ids[-1] == after[0]:
            return ids + after[1:]
        return ids + after


def parse_calls(text: str, tools: Sequence[ToolSpec]) -> list[ParsedCall]:
    """The function calls in ``text`` (none if it opens none); :class:`InvalidToolCall`
    if it opens one that does not parse or names no tool of the request."""
    if CALL_OPEN not in text:
        return []
    names = {t.name for t in tools}
    calls = []
    for body in _CALL.findall(text):
        try:
            data = json.loads(body)
        except ValueError:
            raise InvalidToolCall(f"{body.strip()[:200]!r} is not JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise InvalidToolCall("a call is a JSON object with a 'name' and its 'arguments'")
        if data["name"] not in names:
            raise InvalidToolCall(f"no tool is named {data['name']!r}")
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise InvalidToolCall(f"the arguments of {data['name']!r} are not JSON") from None
        if not isinstance(arguments, dict):
            raise InvalidToolCall(f"the arguments of {data['name']!r} are not a JSON object")
        calls.append(ParsedCall(data["name"], json.dumps(arguments, ensure_ascii=False)))
    if not calls:
        raise InvalidToolCall(f"{CALL_OPEN} is not closed by {CALL_CLOSE}")
    return calls


def call_text(name: str, arguments: str) -> str:
    try:
        args: Any = json.loads(arguments)
    except ValueError:
        args = arguments
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n{CALL_CLOSE}"


def tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """The Hermes-style tool description (what Qwen 2.5's template writes for ``tools``)."""
    lines = [
        json.dumps(
            {"type": "function", "function": {"name": t.name, "parameters": t.parameters}},
            sort_keys=True,
            ensure_ascii=False,
        )
        for t in tools
        if not t.custom
    ]
    lines += [
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "parameters": {"type": "object", "properties": {"input": {"type": "string"}}},
                },
            },
            sort_keys=True,
        )
        for t in tools
        if t.custom
    ]
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + "\n".join(lines)
        + "\n</tools>\n\nFor each function call, return a json object with function "
        "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


@lru_cache(maxsize=8)
def _load(path: str) -> TemplateFormat:
    from transformers import AutoTokenizer  # the real-model extra

    return TemplateFormat(AutoTokenizer.from_pretrained(path), f"template:{path}")
