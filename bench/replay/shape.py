"""The privacy-safe shape of a recorded session: sizes, kinds, counts and durations, no text.

A format reader (:mod:`bench.replay.codex`, :mod:`bench.replay.claude`) turns a log into
:data:`Record` values — every text already measured with the project's tokenizer (cl100k)
and dropped — and :func:`build` groups them into steps.  A *step* is one model request:
the input items new since the previous step, then what the model produced (reasoning,
text, calls).  A compaction ends a chain: the next step starts a new one (no
``previous_response_id``), its input the summary the log holds.

:class:`ShapeFile` is the only artifact ``responses-ws replay --export-shape`` writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from inference.tokenizer import encode

SHAPE_VERSION = 2  # 2: reasoning planned from the recorded output; reasoning_reported


def tokens(text: str) -> int:
    """The size of ``text`` in cl100k tokens (the text itself is not kept)."""
    return len(encode(text)) if text else 0


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Input:
    """An input item the client sent: a message (``kind`` = its role) or a summary."""

    line: int
    kind: str
    tokens: int
    t: float | None = None


@dataclass(frozen=True, slots=True)
class ToolOutput:
    line: int
    call_id: str
    tokens: int
    duration_s: float | None  # recorded by the tool (Wall time, duration_seconds, durationMs)
    source: str | None = None
    t: float | None = None


@dataclass(frozen=True, slots=True)
class Reasoning:
    line: int
    tokens: int | None  # None: not readable (encrypted, redacted): from the usage
    response_id: str | None = None
    t: float | None = None


@dataclass(frozen=True, slots=True)
class Text:
    line: int
    tokens: int
    response_id: str | None = None
    t: float | None = None


@dataclass(frozen=True, slots=True)
class Call:
    line: int
    call_id: str
    name: str
    kind: Literal["function", "custom"]
    argument_tokens: int
    response_id: str | None = None
    t: float | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    line: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int | None
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class Compaction:
    line: int
    t: float | None = None


@dataclass(frozen=True, slots=True)
class Skip:
    line: int
    kind: str
    reason: str


Record = Input | ToolOutput | Reasoning | Text | Call | Usage | Compaction | Skip
Output = Reasoning | Text | Call


# --------------------------------------------------------------------------- the shape


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CallShape(_Model):
    name: str
    kind: Literal["function", "custom"]
    argument_tokens: int


class InputShape(_Model):
    """A new input item; a tool output names the call it answers (``[step, call]``)."""

    kind: str
    tokens: int
    answers: tuple[int, int] | None = None
    tool_s: float | None = None
    tool_s_source: str | None = None


class UsageShape(_Model):
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int | None = None


class StepShape(_Model):
    index: int
    new_chain: bool = False
    gap_s: float | None = None  # the human's time before this step (a user message), if recorded
    inputs: list[InputShape] = []
    reasoning_tokens: int = 0  # planned hidden reasoning: the recorded output beyond the visible part
    reasoning_source: Literal["usage", "text", "residual", "none"] = "none"  # what the log said of it
    reasoning_reported: int | None = None  # the log's own figure (its usage breakdown, or measured text)
    text_tokens: int = 0
    calls: list[CallShape] = []
    tool_s: float = 0.0  # the step's calls' tool time: the slowest (parallel calls wait for it)
    recorded: UsageShape | None = None

    @property
    def visible_tokens(self) -> int:
        """The step's text and call arguments (cl100k)."""
        return self.text_tokens + sum(c.argument_tokens for c in self.calls)

    @property
    def output_tokens(self) -> int:
        """What the replay asks the model for (cl100k)."""
        return self.reasoning_tokens + self.visible_tokens


class Skipped(_Model):
    kind: str
    reason: str
    count: int
    first_line: int


class SessionShape(_Model):
    label: str
    format: Literal["codex", "claude"]
    model: str | None = None
    instructions_tokens: int = 0
    instructions_source: Literal["recorded", "inferred", "none"] = "none"
    tools: list[str] = []  # names of the tools called (definitions are not recorded)
    tool_definition_tokens: int = 0  # inferred from the first prompt (formats.read_session)
    steps: list[StepShape] = []
    skipped: list[Skipped] = []


class ShapeFile(_Model):
    version: int = SHAPE_VERSION
    tokenizer: str = "cl100k_base"
    sessions: list[SessionShape] = []


# --------------------------------------------------------------------------- grouping


class _Builder:
    def __init__(self) -> None:
        self.steps: list[StepShape] = []
        self.pending: list[InputShape] = []
        self.pending_gap: float | None = None
        self.new_chain = False
        self.open = False  # the last step still takes outputs
        self.calls: dict[str, tuple[int, int]] = {}
        self.skips: dict[tuple[str, str], Skipped] = {}
        self.last_t: float | None = None
        self.step_ids: list[str | None] = []  # each step's response id (Claude Code logs have them)

    def skip(self, line: int, kind: str, reason: str) -> None:
        key = (kind, reason)
        if key in self.skips:
            self.skips[key].count += 1
        else:
            self.skips[key] = Skipped(kind=kind, reason=reason, count=1, first_line=line)

    def add(self, rec: Record) -> None:
        if isinstance(rec, Skip):
            self.skip(rec.line, rec.kind, rec.reason)
        elif isinstance(rec, Input):
            if (
                rec.kind == "user"
                and rec.t is not None
                and self.last_t is not None
                and self.steps
                and self.pending_gap is None
            ):
                self.pending_gap = max(0.0, rec.t - self.last_t)
            self.pending.append(InputShape(kind=rec.kind, tokens=rec.tokens))
            self.open = False
        elif isinstance(rec, ToolOutput):
            self._tool_output(rec)
        elif isinstance(rec, Compaction):
            self.pending, self.new_chain, self.open = [], True, False
        elif isinstance(rec, Usage):
            self._usage(rec)
        else:
            self._output(rec)
        t = getattr(rec, "t", None)
        if t is not None and not isinstance(rec, Input):  # a human gap ends at the user's message
            self.last_t = t

    def _tool_output(self, rec: ToolOutput) -> None:
        answers = self.calls.pop(rec.call_id, None)
        if answers is None:
            self.skip(rec.line, "tool_output", "answers no call recorded before it")
            return
        self.pending.append(
            InputShape(
                kind="tool_output",
                tokens=rec.tokens,
                answers=answers,
                tool_s=rec.duration_s,
                tool_s_source=rec.source,
            )
        )
        if rec.duration_s is not None:
            step = self.steps[answers[0]]
            step.tool_s = max(step.tool_s, rec.duration_s)
        self.open = False

    def _output(self, rec: Output) -> None:
        if not self.open or (rec.response_id is not None and rec.response_id != self.step_ids[-1]):
            self.steps.append(
                StepShape(
                    index=len(self.steps),
                    new_chain=self.new_chain and bool(self.steps),
                    gap_s=self.pending_gap,
                    inputs=self.pending,
                )
            )
            self.pending, self.pending_gap, self.new_chain = [], None, False
            self.open = True
            self.step_ids.append(rec.response_id)
        step = self.steps[-1]
        if isinstance(rec, Reasoning):
            if rec.tokens is not None:  # None: not readable (encrypted, redacted): from the usage
                step.reasoning_tokens += rec.tokens
                step.reasoning_source = "text"
        elif isinstance(rec, Text):
            step.text_tokens += rec.tokens
        else:
            self.calls[rec.call_id] = (step.index, len(step.calls))
            step.calls.append(CallShape(name=rec.name, kind=rec.kind, argument_tokens=rec.argument_tokens))

    def _usage(self, rec: Usage) -> None:
        if not self.steps:
            return
        step = self.steps[-1]
        if rec.response_id is not None and rec.response_id != self.step_ids[-1]:
            return
        usage = UsageShape(
            input_tokens=rec.input_tokens,
            cached_tokens=rec.cached_tokens,
            output_tokens=rec.output_tokens,
            reasoning_tokens=rec.reasoning_tokens,
        )
        if step.recorded is None or rec.response_id is not None:  # a log line per block: the latest wins
            step.recorded = usage
        if rec.response_id is None:  # Codex: one token count after each response
            self.open = False

    def finish(self) -> tuple[list[StepShape], list[Skipped]]:
        for step in self.steps:
            _plan_reasoning(step)
        return self.steps, list(self.skips.values())


def _plan_reasoning(step: StepShape) -> None:
    """A step with recorded usage is replayed at its recorded output tokens (what the model
    spent), whatever the log's breakdown says: the part the visible text and arguments do not
    explain becomes hidden reasoning.  ``reasoning_source`` says what the log itself reported:
    ``usage`` (its breakdown gave reasoning tokens), ``text`` (readable reasoning, measured),
    ``residual`` (nothing: all of it inferred from the output), ``none`` (no usage, no reasoning)."""
    usage = step.recorded
    if step.reasoning_source == "text":
        step.reasoning_reported = step.reasoning_tokens
    if usage is None:
        return
    if usage.reasoning_tokens:
        step.reasoning_source, step.reasoning_reported = "usage", usage.reasoning_tokens
    elif step.reasoning_source != "text":
        step.reasoning_source = "residual" if usage.output_tokens > step.visible_tokens else "none"
    step.reasoning_tokens = max(0, usage.output_tokens - step.visible_tokens)


def build(records: Iterable[Record]) -> tuple[list[StepShape], list[Skipped]]:
    """Steps (module doc) and what was skipped, with why."""
    b = _Builder()
    for rec in records:
        b.add(rec)
    return b.finish()
