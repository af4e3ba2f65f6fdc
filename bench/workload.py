"""A Codex-like agent workload, deterministic per seed.

A rollout is: system instructions and tool definitions of realistic size (several thousand
tokens, sent with every request, as coding agents do), optionally the history of an earlier
session it resumes, a task message, then ``tool_rounds`` rounds of *model calls a tool →
the client runs it (simulated time) → the tool's output (file contents, test logs) goes
back*, and a final text answer.  The emulated model's behaviour is shaped per request
through ``metadata`` (docs/emulator.md): ``emulator.tool_rounds``, ``emulator.text_tokens``
and ``emulator.reasoning_tokens``.  Nothing here touches the network.

Three presets (:data:`PRESETS`): ``uniform``, the fixed-size loop (sizes uniform in ±50 %
around their means); ``codex``, sizes drawn from lognormal distributions fitted to published
Codex CLI trace statistics (:data:`CODEX`; every figure and its source is in
docs/benchmark.md, "The codex preset"), its first create resending a resumed session; and
``crowd``, a crowd of Codex-like loops starting fresh: ~4000-word instructions and 8 tools
(~30 KB together) resent with every create, ~300-word tool outputs, ~2 s of tool time, no
resumed history, so the first creates of a crowd share everything but their task
(``bench capacity``'s default: the protocol's cost, not a prefill queue).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

from .texts import CODE_LINES, IDENT, LOG_LINES, fill, prose

Z90 = 1.2815515655446004  # the standard normal's 0.9 quantile


@dataclass(frozen=True)
class Lognormal:
    """A lognormal given by its median and 90th percentile, drawn values clamped to
    ``[low, cap]`` (a cap such as Codex's 10k-token tool-output truncation)."""

    median: float
    p90: float
    cap: float
    low: float = 1.0

    @property
    def sigma(self) -> float:
        return math.log(self.p90 / self.median) / Z90

    def draw(self, rng: random.Random) -> float:
        return min(self.cap, max(self.low, self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))))


@dataclass(frozen=True)
class Shape:
    """Per-rollout and per-turn sizes drawn from distributions instead of fixed means."""

    tool_rounds: Lognormal  # tool calls per rollout (one user request)
    tool_output_tokens: Lognormal  # new input per step: one tool output
    step_output_tokens: Lognormal  # model output per step, reasoning included
    tool_time_ms: Lognormal  # one tool execution on the client
    call_tokens: int = 40  # the visible part of a step that calls a tool (its arguments)


# Codex CLI steps in the TraceLab dataset (docs/benchmark.md has the sources of each figure).
CODEX = Shape(
    tool_rounds=Lognormal(median=8, p90=20, cap=60),
    tool_output_tokens=Lognormal(median=886, p90=8300, cap=10_000, low=16),
    step_output_tokens=Lognormal(median=184, p90=939, cap=8_000),
    tool_time_ms=Lognormal(median=300, p90=1500, cap=60_000, low=5),
)


@dataclass(frozen=True)
class Workload:
    """What one rollout looks like.  Every field is a command-line option of ``bench``
    (``shape`` through ``--preset``); with a ``shape`` its distributions replace
    ``tool_rounds``, ``tool_output_tokens``, ``tool_time_ms`` and ``text_tokens``."""

    model: str = "emu-fast"
    tool_rounds: int = 20  # tool calls before the model answers in text
    system_tokens: int = 3000  # instructions
    tool_def_tokens: int = 1500  # all tool definitions together
    task_tokens: int = 120  # the user's task message
    tool_output_tokens: int = 800  # mean size of one tool output (uniform in ±50 %)
    text_tokens: int = 150  # the final answer
    tool_time_ms: float = 20.0  # simulated client-side tool execution, mean (uniform ±50 %)
    seed: int = 0
    resume_tokens: int = 0  # an earlier session's history before the task (~tokens)
    # a document of that many tokens before it, the same in every rollout (one user message of
    # numbered words: a stateless client's large prompt, resent whole with each request)
    document_tokens: int = 0
    shape: Shape | None = None
    extra_metadata: dict[str, str] = field(default_factory=dict)
    # Prompt-cache breakpoints as a client places them (bench.breakpoints): after the
    # instructions and tools (with ``breakpoint_ttl``, None: the request's) and at each
    # turn's last tool output.
    breakpoints: bool = False
    breakpoint_ttl: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, Workload] = {
    "uniform": Workload(),
    # Codex's prompt files are ~2-7k tokens; resumed session of ~60k tokens (published
    # cached prefixes: p50 116k, p90 202k; the context sweep covers 10k-200k).
    "codex": Workload(
        system_tokens=5000, tool_def_tokens=2000, task_tokens=150, resume_tokens=60_000, shape=CODEX
    ),
    # ~4000 words of instructions (22 KB), 8 tools of ~150 words each (9 KB): ~30 KB a
    # create resends; a tool output of ~450 tokens (~1.8 KB of code or log, ~300 words),
    # 1-3 s of tool time, 8 calls a rollout (Codex's median)
    "crowd": Workload(
        system_tokens=4030,
        tool_def_tokens=1500,
        tool_output_tokens=450,
        tool_time_ms=2000.0,
        tool_rounds=8,
    ),
}


def rounds(w: Workload, rollout: int) -> int:
    """Tool calls in rollout ``rollout`` (then the model answers in text)."""
    if w.shape is None:
        return w.tool_rounds
    return round(w.shape.tool_rounds.draw(random.Random(f"rounds/{w.seed}/{rollout}")))


@lru_cache(maxsize=16)
def instructions(system_tokens: int, seed: int) -> str:
    rng = random.Random(f"instructions/{seed}")
    head = (
        "You are a coding agent running in a terminal. You read files, run commands and "
        "apply patches to complete the user's task. "
    )
    return head + prose(rng, system_tokens - 30)


_TOOL_SHAPES: tuple[tuple[str, dict], ...] = (
    (
        "shell",
        {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000},
        },
    ),
    ("apply_patch", {"input": {"type": "string"}}),
    (
        "read_file",
        {
            "path": {"type": "string"},
            "offset": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1, "maximum": 2000},
        },
    ),
    ("list_dir", {"path": {"type": "string"}, "depth": {"type": "integer", "minimum": 1, "maximum": 5}}),
    (
        "grep_files",
        {"pattern": {"type": "string"}, "path": {"type": "string"}, "include": {"type": "string"}},
    ),
    (
        "update_plan",
        {
            "explanation": {"type": "string"},
            "plan": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "step": {"type": "string"},
                        "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                    },
                    "required": ["step", "status"],
                    "additionalProperties": False,
                },
            },
        },
    ),
    ("run_tests", {"selector": {"type": "string"}, "verbose": {"type": "boolean"}}),
    ("view_image", {"path": {"type": "string"}}),
)


@lru_cache(maxsize=16)
def _tools(tool_def_tokens: int, seed: int) -> tuple[tuple[str, str, tuple], ...]:
    rng = random.Random(f"tools/{seed}")
    per_tool = max(20, tool_def_tokens // len(_TOOL_SHAPES) - 40)
    return tuple((name, prose(rng, per_tool), tuple(props.items())) for name, props in _TOOL_SHAPES)


def tools(w: Workload) -> list[dict]:
    """Function tools in the Responses API's flat shape, as Codex sends them."""
    out = []
    for name, description, props in _tools(w.tool_def_tokens, w.seed):
        properties = dict(props)
        out.append(
            {
                "type": "function",
                "name": name,
                "description": description,
                "strict": False,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": list(properties)[:1],
                    "additionalProperties": False,
                },
            }
        )
    return out


def fixed(w: Workload) -> dict[str, Any]:
    """What every create of the workload's rollouts carries: the model, instructions and tools."""
    return {"model": w.model, "instructions": instructions(w.system_tokens, w.seed), "tools": tools(w)}


def task(w: Workload, rollout: int) -> str:
    rng = random.Random(f"task/{w.seed}/{rollout}")
    return "The test suite fails after the last change. Find the cause and fix it. " + prose(
        rng, w.task_tokens
    )


def tool_output(w: Workload, rollout: int, turn: int, call: int, tool_name: str) -> str:
    rng = random.Random(f"output/{w.seed}/{rollout}/{turn}/{call}")
    if w.shape is None:
        size = max(8, round(w.tool_output_tokens * rng.uniform(0.5, 1.5)))
    else:
        size = round(w.shape.tool_output_tokens.draw(rng))
    templates = LOG_LINES if tool_name in ("shell", "run_tests") else CODE_LINES
    return fill(rng, templates, size)


def tool_time_s(w: Workload, rollout: int, turn: int) -> float:
    rng = random.Random(f"tooltime/{w.seed}/{rollout}/{turn}")
    if w.shape is not None:
        return w.shape.tool_time_ms.draw(rng) / 1000.0
    return max(0.0, w.tool_time_ms * rng.uniform(0.5, 1.5)) / 1000.0


def metadata(w: Workload, rollout: int) -> dict[str, str]:
    """The emulator knobs of rollout ``rollout``'s requests (the same on every turn).

    With a shape, every response reasons for a length the model draws per response from
    the step-output distribution less a call's ~``call_tokens`` of arguments (so a step's
    output, reasoning included, follows it), and the final answer is one draw of it."""
    n = rounds(w, rollout)
    # the model calls tools while the context holds fewer tool results than this
    in_context = n + sum(1 for item in history(w, rollout) if item.get("type") == "function_call_output")
    out = {
        "emulator.tool_rounds": str(in_context),
        "emulator.text_tokens": str(w.text_tokens),
        "emulator.seed": str(w.seed * 100003 + rollout),
    }
    if w.shape is not None:
        step = w.shape.step_output_tokens
        out["emulator.reasoning_tokens"] = str(max(1, round(step.median) - w.shape.call_tokens))
        out["emulator.reasoning_tokens_p90"] = str(max(2, round(step.p90) - w.shape.call_tokens))
        out["emulator.text_tokens"] = str(round(step.draw(random.Random(f"answer/{w.seed}/{rollout}"))))
    return {**out, **w.extra_metadata}


def history(w: Workload, rollout: int) -> list[dict[str, Any]]:
    """The earlier session rollout ``rollout`` resumes: ~``resume_tokens`` tokens of past
    requests (a user message, tool calls with their outputs, the answer), as input items a
    client resending the conversation sends; empty when ``resume_tokens`` is 0; after the
    workload's document (``document_tokens``) when it has one.  Cached: callers must not change
    the items."""
    past = _history(w.seed, rollout, w.resume_tokens, w.task_tokens, w.tool_output_tokens, w.shape)
    return [*_document(w.document_tokens), *past]


@lru_cache(maxsize=4)
def _document(tokens: int) -> tuple[dict[str, Any], ...]:
    """The workload's document: one user message of ``tokens`` cl100k tokens, numbered words
    (``word0 word1 … word996``, two tokens each, over again); none for 0."""
    if tokens <= 0:
        return ()
    text = " ".join(f"word{i % 997}" for i in range(tokens // 2))
    return ({"role": "user", "content": [{"type": "input_text", "text": text}]},)


@lru_cache(maxsize=64)
def _history(
    seed: int,
    rollout: int,
    resume_tokens: int,
    task_tokens: int,
    tool_output_tokens: int,
    shape: Shape | None,
) -> tuple[dict[str, Any], ...]:
    w = Workload(
        seed=seed,
        resume_tokens=resume_tokens,
        task_tokens=task_tokens,
        tool_output_tokens=tool_output_tokens,
        shape=shape,
    )
    rng = random.Random(f"history/{w.seed}/{rollout}")
    items: list[dict[str, Any]] = []
    budget = w.resume_tokens
    past = 0
    while budget > 0:
        items.append({"role": "user", "content": [{"type": "input_text", "text": prose(rng, w.task_tokens)}]})
        budget -= w.task_tokens
        for step in range(rounds(w, 10_000 + rollout * 100 + past)):
            name = _TOOL_SHAPES[rng.randrange(4)][0]  # shell, apply_patch, read_file, list_dir
            call_id = f"call_resumed_{rollout}_{past}_{step}"
            args = (
                f'{{"command": ["bash", "-lc", "{rng.choice(IDENT)}"]}}'
                if name == "shell"
                else f'{{"path": "src/{rng.choice(IDENT)}.py"}}'
            )
            output = tool_output(replace(w, seed=w.seed + 7919 * (past + 1)), rollout, step, 0, name)
            items += [
                {"type": "function_call", "call_id": call_id, "name": name, "arguments": args},
                {"type": "function_call_output", "call_id": call_id, "output": output},
            ]
            budget -= 20 + len(output) // 4
            if budget <= 0:
                break
        items.append({"role": "assistant", "content": [{"type": "output_text", "text": prose(rng, 120)}]})
        budget -= 120
        past += 1
    return tuple(items)
