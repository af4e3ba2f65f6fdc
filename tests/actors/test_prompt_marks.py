"""PromptMarks: a connection's prompt breakpoints, the previous turn's reused, always what
prompt_breakpoints computes whole."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from actors.core.context import PromptMarks, prompt_breakpoints
from inference.types import Breakpoint


def entry(marks: tuple[Breakpoint, ...], tokens: int) -> Any:
    """A conversation as the two functions read it: its marks, length and last item."""
    return SimpleNamespace(marks=marks, tokens=[0] * tokens, items=[{"type": "function_call_output"}])


def test_each_turn_matches_the_whole_computation_as_the_conversation_grows():
    memo = PromptMarks()
    marks: tuple[Breakpoint, ...] = ()
    inputs = (Breakpoint(0, implicit=True), Breakpoint(30, "12h"))
    for turn in range(40):
        parent = entry(marks, 100 * turn) if turn else None
        assert memo(500, parent, inputs) == prompt_breakpoints(500, parent, inputs)
        # the next parent: this one's marks and fresh objects for the turn's own (as extend makes them)
        marks = marks + (Breakpoint(100 * turn + 1, implicit=True), Breakpoint(100 * turn + 30, "12h"))


def test_a_new_prefix_or_another_conversation_is_computed_whole():
    memo = PromptMarks()
    a = entry((Breakpoint(10), Breakpoint(20, implicit=True)), 50)
    b = entry((Breakpoint(7, "30m"),), 40)
    inputs = (Breakpoint(0, implicit=True),)
    assert memo(100, a, inputs) == prompt_breakpoints(100, a, inputs)
    assert memo(250, a, inputs) == prompt_breakpoints(250, a, inputs)  # the tools or instructions changed
    assert memo(250, b, inputs) == prompt_breakpoints(250, b, inputs)  # another lane's conversation
    assert memo(250, None, ()) == ()
    assert memo(250, a, inputs) == prompt_breakpoints(250, a, inputs)


def test_a_continuing_turn_reuses_the_previous_turns_breakpoints_themselves():
    """The same objects, so the direct channel's compare with its kept breakpoints is by
    identity (inference.channel: a continuing prompt sends only the new ones)."""
    memo = PromptMarks()
    marks = (Breakpoint(10, implicit=True), Breakpoint(20, implicit=True))
    first = memo(100, entry(marks, 30), (Breakpoint(0, implicit=True),))
    grown = entry((*marks, Breakpoint(30, implicit=True), Breakpoint(40, implicit=True)), 50)
    second = memo(100, grown, (Breakpoint(0, implicit=True),))
    assert len(second) == len(first) + 2  # the output's mark and the new input's
    assert all(a is b for a, b in zip(first, second, strict=False))
