"""A Codex-like agent workload, deterministic per seed.

A rollout is: system instructions and tool definitions of realistic size (several thousand
tokens, sent with every request, as coding agents do), a task message, then ``tool_rounds``
rounds of *model calls a tool → the client runs it (simulated time) → the tool's output
(file contents, test logs) goes back*, and a final text answer.  The emulated model's
behaviour is shaped per request through ``metadata`` (docs/emulator.md):
``emulator.tool_rounds`` and ``emulator.text_tokens``.  Nothing here touches the network.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from functools import lru_cache

# Words that cl100k encodes as one token each (with a leading space), so text sizes are
# close to their target in tokens; the measured sizes are reported in the results anyway.
WORDS = (
    "the a to of and in is that for it with as on be this are by or from at an not you your use "
    "code file test tests function class method value values return error errors call calls "
    "change changes before after when if then else each every only must should never always "
    "run command output input read write path line lines module package import type types "
    "check result results new old first last next make sure keep what which where why how "
    "user agent tool tools patch diff repository branch commit build fix bug issue data list "
    "string number object field name names state config server client request response time "
    "small large short long simple clear exact same other more less most all any some no one "
    "two three work works working need needs do does done can will may also just now here there"
).split()

CODE_LINES = (
    "def {n}(self, {a}, {b}=None):", "    if {a} is None:", "        return {b}",
    "    result = self._{n}({a})", "    for item in {a}:", "        total += item.{b}",
    "    raise ValueError(f\"bad {a}: {{{a}!r}}\")", "class {N}({N}Base):",
    "    \"\"\"{doc}\"\"\"", "import {a}", "from .{a} import {n}", "    return {a}.{n}({b})",
    "    assert {a} == {b}, {a}", "    self.{a} = {b}", "",
)
LOG_LINES = (
    "tests/test_{a}.py::test_{n}_{b} PASSED", "tests/test_{a}.py::test_{n} FAILED",
    "E       AssertionError: assert {a} == {b}", "E       +  where {a} = {n}({b})",
    "{a}.py:{num}: in {n}", "    {a} = {n}({b})", "---------- captured log call ----------",
    "WARNING  {a}:{n}.py:{num} {doc}", "===== {num} passed, 1 failed in 0.{num}s =====",
)
IDENT = ("config", "session", "store", "parser", "render", "token", "cache", "lane", "value",
         "item", "path", "state", "event", "frame", "buffer", "handle", "limit", "count")


@dataclass(frozen=True)
class Workload:
    """What one rollout looks like.  Every field is a command-line option of ``bench``."""

    model: str = "emu-fast"
    tool_rounds: int = 20          # tool calls before the model answers in text
    system_tokens: int = 3000      # instructions
    tool_def_tokens: int = 1500    # all tool definitions together
    task_tokens: int = 120         # the user's task message
    tool_output_tokens: int = 800  # mean size of one tool output (uniform in ±50 %)
    text_tokens: int = 150         # the final answer
    tool_time_ms: float = 20.0     # simulated client-side tool execution, mean (uniform ±50 %)
    seed: int = 0
    extra_metadata: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _prose(rng: random.Random, tokens: int) -> str:
    words = [rng.choice(WORDS) for _ in range(max(tokens, 1))]
    out, sentence = [], []
    for i, w in enumerate(words):
        sentence.append(w)
        if len(sentence) >= rng.randint(8, 18) or i == len(words) - 1:
            out.append(" ".join(sentence).capitalize() + ".")
            sentence = []
    return " ".join(out)


def _fill(rng: random.Random, templates: tuple[str, ...], tokens: int) -> str:
    """Code-like or log-like lines, ~``tokens`` cl100k tokens (about 7 per line)."""
    lines = []
    for _ in range(max(1, tokens // 7)):
        lines.append(rng.choice(templates).format(
            n=rng.choice(IDENT), a=rng.choice(IDENT), b=rng.choice(IDENT), N=rng.choice(IDENT).title(),
            num=rng.randint(10, 999), doc=" ".join(rng.choice(WORDS) for _ in range(5))))
    return "\n".join(lines)


@lru_cache(maxsize=16)
def instructions(system_tokens: int, seed: int) -> str:
    rng = random.Random(f"instructions/{seed}")
    head = ("You are a coding agent running in a terminal. You read files, run commands and "
            "apply patches to complete the user's task. ")
    return head + _prose(rng, system_tokens - 30)


_TOOL_SHAPES: tuple[tuple[str, dict], ...] = (
    ("shell", {"command": {"type": "array", "items": {"type": "string"}},
               "workdir": {"type": "string"}, "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000}}),
    ("apply_patch", {"input": {"type": "string"}}),
    ("read_file", {"path": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
                   "limit": {"type": "integer", "minimum": 1, "maximum": 2000}}),
    ("list_dir", {"path": {"type": "string"}, "depth": {"type": "integer", "minimum": 1, "maximum": 5}}),
    ("grep_files", {"pattern": {"type": "string"}, "path": {"type": "string"},
                    "include": {"type": "string"}}),
    ("update_plan", {"explanation": {"type": "string"},
                     "plan": {"type": "array", "items": {"type": "object", "properties": {
                         "step": {"type": "string"},
                         "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}},
                         "required": ["step", "status"], "additionalProperties": False}}}),
    ("run_tests", {"selector": {"type": "string"}, "verbose": {"type": "boolean"}}),
    ("view_image", {"path": {"type": "string"}}),
)


@lru_cache(maxsize=16)
def _tools(tool_def_tokens: int, seed: int) -> tuple[tuple[str, str, tuple], ...]:
    rng = random.Random(f"tools/{seed}")
    per_tool = max(20, tool_def_tokens // len(_TOOL_SHAPES) - 40)
    return tuple((name, _prose(rng, per_tool), tuple(props.items())) for name, props in _TOOL_SHAPES)


def tools(w: Workload) -> list[dict]:
    """Function tools in the Responses API's flat shape, as Codex sends them."""
    out = []
    for name, description, props in _tools(w.tool_def_tokens, w.seed):
        properties = dict(props)
        out.append({"type": "function", "name": name, "description": description, "strict": False,
                    "parameters": {"type": "object", "properties": properties,
                                   "required": list(properties)[:1], "additionalProperties": False}})
    return out


def task(w: Workload, rollout: int) -> str:
    rng = random.Random(f"task/{w.seed}/{rollout}")
    return "The test suite fails after the last change. Find the cause and fix it. " + _prose(rng, w.task_tokens)


def tool_output(w: Workload, rollout: int, turn: int, call: int, tool_name: str) -> str:
    rng = random.Random(f"output/{w.seed}/{rollout}/{turn}/{call}")
    size = max(8, round(w.tool_output_tokens * rng.uniform(0.5, 1.5)))
    templates = LOG_LINES if tool_name in ("shell", "run_tests") else CODE_LINES
    return _fill(rng, templates, size)


def tool_time_s(w: Workload, rollout: int, turn: int) -> float:
    rng = random.Random(f"tooltime/{w.seed}/{rollout}/{turn}")
    return max(0.0, w.tool_time_ms * rng.uniform(0.5, 1.5)) / 1000.0


def metadata(w: Workload, rollout: int) -> dict[str, str]:
    return {"emulator.tool_rounds": str(w.tool_rounds), "emulator.text_tokens": str(w.text_tokens),
            "emulator.seed": str(w.seed * 100003 + rollout), **w.extra_metadata}
