"""Writes the replay's synthetic fixtures, made up from the formats' definitions (never a
real session): a Codex CLI rollout, a Claude Code log and a JSON-lines file of neither kind.

    python tests/bench/data/replay/make_fixtures.py tests/bench/data/replay

The Codex rollout covers every record type (``session_meta``, ``turn_context``,
``response_item``, ``event_msg``, ``compacted``), an unknown one, a malformed line, parallel
calls, a freeform ``apply_patch`` call, both recorded tool durations, a repeated token count,
a hosted web search, a 40 s human gap and a compaction.  The Claude Code log covers one
message spread over several lines, thinking (plain and redacted), parallel ``tool_use``,
``durationMs``, a compaction boundary with its summary, a sidechain line, an API-error
notice and metadata lines.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

SENTENCE = (
    "the parser reads the header and checks every field before the body is decoded so that "
    "a bad value fails early with a clear message for the caller"
)
WORDS = SENTENCE.split()


def words(n: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


class Clock:
    def __init__(self, start: float) -> None:
        self.t = start

    def stamp(self, dt: float) -> str:
        self.t += dt
        moment = datetime.datetime.fromtimestamp(self.t, datetime.UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Rollout:
    """A Codex rollout: ``{timestamp, type, payload}`` lines."""

    def __init__(self) -> None:
        self.clock = Clock(1767607200.0)  # 2026-01-05T10:00:00Z
        self.lines: list[str] = []
        self.total = dict.fromkeys(
            (
                "input_tokens",
                "cached_input_tokens",
                "output_tokens",
                "reasoning_output_tokens",
                "total_tokens",
            ),
            0,
        )

    def rec(self, kind: str, payload: dict, dt: float = 0.5) -> None:
        self.lines.append(json.dumps({"timestamp": self.clock.stamp(dt), "type": kind, "payload": payload}))

    def count(self, inp: int, cached: int, out: int, reasoning: int) -> None:
        last = {
            "input_tokens": inp,
            "cached_input_tokens": cached,
            "output_tokens": out,
            "reasoning_output_tokens": reasoning,
            "total_tokens": inp + out,
        }
        for k in self.total:
            self.total[k] += last[k]
        self.rec(
            "event_msg",
            {
                "type": "token_count",
                "info": {
                    "total_token_usage": dict(self.total),
                    "last_token_usage": last,
                    "model_context_window": 272000,
                },
                "rate_limits": None,
            },
            0.1,
        )

    def repeat_count(self) -> None:
        self.rec(
            "event_msg",
            {
                "type": "token_count",
                "info": {
                    "total_token_usage": dict(self.total),
                    "last_token_usage": {},
                    "model_context_window": 272000,
                },
                "rate_limits": None,
            },
            0.1,
        )

    def msg(self, role: str, text: str, dt: float = 0.2) -> None:
        part = "output_text" if role == "assistant" else "input_text"
        self.rec(
            "response_item", {"type": "message", "role": role, "content": [{"type": part, "text": text}]}, dt
        )

    def reasoning(self) -> None:
        self.rec(
            "response_item",
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "**Tests**"}],
                "content": None,
                "encrypted_content": "gAAAA" + "x" * 200,
            },
            1.0,
        )

    def call(self, cid: str, name: str, args: dict, dt: float = 0.3) -> None:
        self.rec(
            "response_item",
            {"type": "function_call", "name": name, "arguments": json.dumps(args), "call_id": cid},
            dt,
        )

    def out(self, cid: str, text: str, dt: float) -> None:
        self.rec("response_item", {"type": "function_call_output", "call_id": cid, "output": text}, dt)


def exec_output(wall: float, n: int) -> str:
    return (
        f"Chunk ID: 4f2a\nWall time: {wall:.4f} seconds\nProcess exited with code 0\n"
        f"Original token count: {n}\nOutput:\n{words(n)}"
    )


def codex() -> list[str]:
    r = Rollout()
    r.rec(
        "session_meta",
        {
            "id": "0199a000-0000-7000-8000-000000000001",
            "timestamp": r.clock.stamp(0),
            "cwd": "/home/dev/project",
            "originator": "codex_cli_rs",
            "cli_version": "0.171.0",
            "source": "cli",
            "model_provider": "openai",
            "base_instructions": {"text": "You are a coding agent. " + words(900)},
        },
        0,
    )
    r.msg("developer", "<permissions instructions>" + words(120) + "</permissions instructions>")
    r.msg(
        "user", "<environment_context><cwd>/home/dev/project</cwd><shell>bash</shell></environment_context>"
    )
    r.rec(
        "turn_context",
        {
            "cwd": "/home/dev/project",
            "approval_policy": "on-request",
            "sandbox_policy": {"type": "workspace-write"},
            "model": "gpt-5-codex",
            "effort": "medium",
            "summary": "auto",
        },
    )
    r.rec(
        "event_msg",
        {"type": "user_message", "message": "The parser test fails, please fix it.", "images": []},
    )
    r.msg("user", "The parser test fails, please fix it.")
    r.reasoning()  # step 0
    r.call("call_a1", "exec_command", {"cmd": "rg -n parse_header src tests"})
    r.count(2350, 0, 79, 64)
    r.out("call_a1", exec_output(0.4, 180), 0.5)
    r.reasoning()  # step 1: commentary and two parallel calls
    r.msg("assistant", "I will read the parser and its test side by side.")
    r.call("call_b1", "exec_command", {"cmd": "sed -n 1,120p src/parser.py"})
    r.call("call_b2", "exec_command", {"cmd": "sed -n 1,80p tests/test_parser.py"}, 0.05)
    r.count(2700, 2304, 231, 180)
    r.out("call_b1", exec_output(1.2, 900), 1.3)
    r.out("call_b2", exec_output(0.3, 500), 0.05)
    r.rec("world_state", {"agents_md": "ignored"}, 0.01)  # a record type the reader does not know
    r.reasoning()  # step 2: a freeform apply_patch
    patch = f"*** Begin Patch\n*** Update File: src/parser.py\n@@\n-    {words(40)}\n+    {words(44)}\n*** End Patch\n"
    r.rec(
        "response_item",
        {
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": "call_c1",
            "name": "apply_patch",
            "input": patch,
        },
        0.4,
    )
    r.count(4200, 2688, 415, 300)
    result = {
        "output": "Success. Updated the following files:\nM src/parser.py\n",
        "metadata": {"exit_code": 0, "duration_seconds": 0.2},
    }
    r.rec(
        "response_item",
        {"type": "custom_tool_call_output", "call_id": "call_c1", "output": json.dumps(result)},
        0.3,
    )
    r.repeat_count()  # the same totals again (a rate-limit update): not a new step
    r.reasoning()  # step 3
    r.call("call_d1", "exec_command", {"cmd": "pytest -q tests/test_parser.py"})
    r.count(4400, 4224, 54, 40)
    r.out("call_d1", exec_output(2.5, 160), 2.6)
    r.lines.append(
        '{"timestamp": "2026-01-05T10:00:30.000Z", "type": "response_item", "payload": {"type": "mess'
    )
    r.reasoning()  # step 4: the answer
    r.msg("assistant", "The test passes now: " + words(60))
    r.count(4600, 4480, 118, 50)
    r.rec("event_msg", {"type": "agent_message", "message": "The test passes now."}, 0.05)
    r.rec("event_msg", {"type": "task_complete", "last_agent_message": "The test passes now."}, 0.05)
    r.rec("event_msg", {"type": "user_message", "message": "Also update the README.", "images": []}, 40.0)
    r.msg("user", "Also update the README.", 0.01)
    r.reasoning()  # step 5: the legacy shell tool, its output with metadata.duration_seconds
    r.call("call_e1", "shell", {"command": ["bash", "-lc", "cat README.md"], "timeout_ms": 10000})
    r.count(4800, 4608, 53, 30)
    r.out(
        "call_e1",
        json.dumps({"output": words(300), "metadata": {"exit_code": 0, "duration_seconds": 0.1}}),
        0.2,
    )
    history = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Also update the README."}],
        }
    ]
    r.rec(
        "compacted",
        {"message": "Summary: the parser test was fixed; " + words(150), "replacement_history": history},
        1.0,
    )
    r.rec("event_msg", {"type": "context_compacted"}, 0.01)
    r.reasoning()  # step 6: a new chain
    r.call("call_f1", "exec_command", {"cmd": "wc -l README.md"})
    r.count(3300, 0, 31, 20)
    r.out("call_f1", exec_output(0.5, 20), 0.6)
    r.rec(
        "response_item",
        {
            "type": "web_search_call",
            "status": "completed",
            "action": {"type": "search", "query": "markdown tables"},
        },
        0.3,
    )
    r.reasoning()  # step 7
    r.msg("assistant", "I updated the README: " + words(40))
    r.count(3400, 3328, 97, 50)
    return r.lines


class ClaudeLog:
    """A Claude Code log: one object per line, one line per content block of a message."""

    SESSION = "5f0c0000-0000-4000-8000-000000000002"

    def __init__(self) -> None:
        self.clock = Clock(1767610800.0)
        self.lines: list[str] = []
        self.n = 0

    def line(self, kind: str, dt: float = 0.5, **fields) -> None:
        self.n += 1
        self.lines.append(
            json.dumps(
                {
                    "parentUuid": None,
                    "isSidechain": False,
                    "userType": "external",
                    "cwd": "/home/dev/project",
                    "sessionId": self.SESSION,
                    "version": "2.1.12",
                    "type": kind,
                    "uuid": f"00000000-0000-4000-8000-{self.n:012d}",
                    "timestamp": self.clock.stamp(dt),
                    **fields,
                }
            )
        )

    def user(self, content, dt: float = 0.5, **extra) -> None:
        self.line("user", dt, message={"role": "user", "content": content}, **extra)

    def assistant(self, mid: str, blocks: list[dict], usage: dict, dt: float = 1.0) -> None:
        for i, block in enumerate(blocks):
            self.line(
                "assistant",
                dt if i == 0 else 0.2,
                requestId="req_" + mid,
                message={
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5",
                    "content": [block],
                    "stop_reason": None,
                    "usage": usage,
                },
            )

    def result(self, cid: str, text: str, dt: float, **extra) -> None:
        self.user([{"type": "tool_result", "tool_use_id": cid, "content": text}], dt, **extra)


def usage(inp: int, create: int, read: int, out: int) -> dict:
    return {
        "input_tokens": inp,
        "cache_creation_input_tokens": create,
        "cache_read_input_tokens": read,
        "output_tokens": out,
    }


def claude() -> list[str]:
    c = ClaudeLog()
    c.lines.append(
        json.dumps(
            {
                "type": "summary",
                "summary": "Adding a verbose flag",
                "leafUuid": "00000000-0000-4000-8000-000000000099",
            }
        )
    )
    c.lines.append(
        json.dumps(
            {"type": "file-history-snapshot", "messageId": "m0", "snapshot": {}, "isSnapshotUpdate": False}
        )
    )
    c.user("Add a --verbose flag to the command line tool.")
    c.assistant(
        "msg_01",
        [
            {"type": "thinking", "thinking": words(90), "signature": "sig"},
            {"type": "text", "text": "Let me look at the entry point."},
            {
                "type": "tool_use",
                "id": "toolu_01",
                "name": "Read",
                "input": {"file_path": "/home/dev/project/cli.py"},
            },
        ],
        usage(3, 14000, 0, 112),
    )
    c.result("toolu_01", words(700), 0.3)
    c.assistant(
        "msg_02",
        [
            {
                "type": "tool_use",
                "id": "toolu_02",
                "name": "Edit",
                "input": {
                    "file_path": "/home/dev/project/cli.py",
                    "old_string": words(30),
                    "new_string": words(36),
                },
            }
        ],
        usage(4, 900, 14000, 92),
    )
    c.result("toolu_02", "The file has been updated.", 0.9)
    c.assistant(
        "msg_03",
        [
            {"type": "redacted_thinking", "data": "opaque"},
            {
                "type": "tool_use",
                "id": "toolu_03",
                "name": "Bash",
                "input": {"command": "python -m pytest -q", "description": "Run the tests"},
            },
            {
                "type": "tool_use",
                "id": "toolu_04",
                "name": "Grep",
                "input": {"pattern": "verbose", "path": "."},
            },
        ],
        usage(5, 300, 14900, 150),
    )
    c.result("toolu_03", words(120), 3.1)
    c.result("toolu_04", words(40), 0.05, toolUseResult={"mode": "content", "numFiles": 2, "durationMs": 45})
    c.line(
        "assistant",
        0.1,
        isSidechain=True,
        message={
            "id": "msg_side",
            "role": "assistant",
            "model": "claude-haiku-4-5",
            "content": [{"type": "text", "text": "sub-agent"}],
            "usage": usage(1, 0, 0, 2),
        },
    )
    c.line(
        "assistant",
        0.1,
        message={
            "id": "msg_err",
            "role": "assistant",
            "model": "<synthetic>",
            "content": [{"type": "text", "text": "API Error: overloaded"}],
            "usage": usage(0, 0, 0, 0),
        },
    )
    c.assistant(
        "msg_04",
        [{"type": "text", "text": "Added the flag and a test. " + words(50)}],
        usage(3, 500, 15200, 60),
    )
    c.lines.append(
        json.dumps(
            {
                "type": "system",
                "subtype": "compact_boundary",
                "content": "Conversation compacted",
                "isMeta": False,
                "timestamp": c.clock.stamp(30.0),
                "uuid": "00000000-0000-4000-8000-000000000098",
                "sessionId": c.SESSION,
                "compactMetadata": {"trigger": "manual", "preTokens": 15800},
            }
        )
    )
    c.user(
        "This session is being continued from a previous conversation. Summary: " + words(200),
        0.5,
        isCompactSummary=True,
    )
    c.user("Now document the flag.", 5.0)
    c.assistant(
        "msg_05",
        [
            {
                "type": "tool_use",
                "id": "toolu_05",
                "name": "Bash",
                "input": {"command": "grep -n usage README.md"},
            }
        ],
        usage(4, 12500, 0, 13),
    )
    c.result("toolu_05", words(25), 0.7)
    c.assistant(
        "msg_06",
        [{"type": "text", "text": "Documented it in the README. " + words(30)}],
        usage(3, 200, 12500, 39),
    )
    return c.lines


def main(root: Path) -> None:
    rollout = (
        root
        / "codex"
        / "2026"
        / "01"
        / "05"
        / "rollout-2026-01-05T10-00-00-0199a000-0000-7000-8000-000000000001.jsonl"
    )
    log = root / "claude" / "-home-dev-project" / f"{ClaudeLog.SESSION}.jsonl"
    for path, lines in ((rollout, codex()), (log, claude())):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    (root / "notes.jsonl").write_text(
        json.dumps({"event": "build", "ok": True}) + "\n" + json.dumps({"event": "test"}) + "\n"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
