"""What a chat format is, for the session that renders with one (``actors.core.render``).

Two implementations: the emulated models' cl100k format, the module
:mod:`inference.chat_format` itself, and a real model's own tokenizer and chat template,
:class:`inference.chat_template.TemplateFormat` (docs/backends.md).  Both render a
conversation segment by segment — ``render(a + b) == render(a) + render(b)`` — so a session
appends each turn's tokens to the ones it caches.  ``name`` identifies the token space: a
conversation cached in one format is re-rendered before a model of another continues it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from inference import chat_format
from inference.types import ToolSpec


class ChatFormat(Protocol):
    @property
    def name(self) -> str: ...

    def render_tools(self, tools: Sequence[ToolSpec]) -> list[int]: ...
    def render_instructions(self, text: str | None) -> list[int]: ...
    def render_message(self, role: str, text: str) -> list[int]: ...
    def render_function_call(self, name: str, arguments: str) -> list[int]: ...
    def render_function_call_output(self, output: str) -> list[int]: ...
    def render_custom_tool_call(self, name: str, tool_input: str) -> list[int]: ...
    def render_other(self, kind: str, text: str) -> list[int]: ...


CL100K: ChatFormat = chat_format  # a module with the functions
